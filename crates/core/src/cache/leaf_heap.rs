//! A max-heap with four children per entry, for the trie caches' eviction candidates: half the
//! levels of a binary heap, and an entry's four children share one cache line. Optimal's
//! replays of the Mooncake trace spent a third of their time in `BinaryHeap`'s pops and pushes;
//! with this heap they take a fifth less (BENCHMARKS.md). Any max-heap pops the same sequence,
//! so no victim changes: entries are numbers, and equal ones are the same leaf.

/// Entries are `u64`s compared as numbers (a [`super::policy`] leaf packs its rank and node).
#[derive(Debug, Clone, Default)]
pub(super) struct QuaternaryHeap {
    entries: Vec<u64>,
}

const ARITY: usize = 4;

impl QuaternaryHeap {
    /// The heap of `entries`, in any order.
    pub(super) fn from_vec(entries: Vec<u64>) -> QuaternaryHeap {
        let mut heap = QuaternaryHeap { entries };
        let len = heap.entries.len();
        if len > 1 {
            for start in (0..=(len - 2) / ARITY).rev() {
                let entry = heap.entries[start];
                heap.sift_down(start, entry);
            }
        }
        heap
    }

    pub(super) fn into_vec(self) -> Vec<u64> {
        self.entries
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }

    pub(super) fn peek(&self) -> Option<u64> {
        self.entries.first().copied()
    }

    pub(super) fn push(&mut self, entry: u64) {
        let mut at = self.entries.len();
        self.entries.push(entry);
        while at > 0 {
            let parent = (at - 1) / ARITY;
            let above = self.entries[parent];
            if above >= entry {
                break;
            }
            self.entries[at] = above;
            at = parent;
        }
        self.entries[at] = entry;
    }

    pub(super) fn pop(&mut self) -> Option<u64> {
        let last = self.entries.pop()?;
        let Some(&top) = self.entries.first() else {
            return Some(last);
        };
        self.sift_down(0, last);
        Some(top)
    }

    /// Puts `entry` at `at` or below, moving larger children up into the hole.
    fn sift_down(&mut self, mut at: usize, entry: u64) {
        let len = self.entries.len();
        loop {
            let first = at * ARITY + 1;
            if first >= len {
                break;
            }
            let end = (first + ARITY).min(len);
            let mut best = first;
            let mut best_entry = self.entries[first];
            for child in first + 1..end {
                let candidate = self.entries[child];
                if candidate > best_entry {
                    best = child;
                    best_entry = candidate;
                }
            }
            if best_entry <= entry {
                break;
            }
            self.entries[at] = best_entry;
            at = best;
        }
        self.entries[at] = entry;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::Xorshift;
    use std::collections::BinaryHeap;

    /// Pushes and pops in random runs, from heaps built whole and empty, against the standard
    /// heap: every pop and every length the same, duplicates and extremes included.
    #[test]
    fn pops_what_the_standard_heap_pops() {
        let mut rng = Xorshift::new(0x5eed_0f4e_a9b1);
        for round in 0..200u64 {
            let range = [2, 16, 1 << 20, u64::MAX][round as usize % 4];
            let start: Vec<u64> = (0..rng.below(300)).map(|_| rng.below(range)).collect();
            let mut ours = QuaternaryHeap::from_vec(start.clone());
            let mut theirs = BinaryHeap::from(start);
            for _ in 0..2_000 {
                if rng.below(3) == 0 {
                    assert_eq!(ours.pop(), theirs.pop(), "round {round}");
                } else {
                    let entry = match rng.below(10) {
                        0 => u64::MAX,
                        1 => 0,
                        _ => rng.below(range),
                    };
                    ours.push(entry);
                    theirs.push(entry);
                }
                assert_eq!(ours.len(), theirs.len());
                assert_eq!(ours.peek(), theirs.peek().copied());
            }
            let mut rest = ours.clone().into_vec();
            rest.sort_unstable();
            assert_eq!(rest, theirs.clone().into_sorted_vec(), "round {round}");
            while let Some(top) = theirs.pop() {
                assert_eq!(ours.pop(), Some(top));
            }
            assert_eq!(ours.pop(), None);
            ours.clear();
            assert_eq!((ours.len(), ours.peek()), (0, None));
        }
    }
}
