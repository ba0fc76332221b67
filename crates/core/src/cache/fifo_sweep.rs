//! FIFO at several capacities, two at a time from one walk over the events with one stamp per
//! node and capacity: the same figures as [`super::policy::Fifo`] replayed at each, without its
//! queue (on the Mooncake trace the six capacities take 2.7–4.3 ms against 7.0 ms replayed).
//! The live view keeps `Fifo`, whose flags take a quarter of the stamps' memory for each of its
//! capacities.
//!
//! A FIFO cache inserts only missing nodes and evicts the oldest insertion once full, so after T
//! insertions it holds exactly the nodes inserted by the last min(T, C): a node evicted by the
//! insertion C after its own cannot be that insertion, so the last C insertions are C distinct
//! nodes. A node is therefore cached while its latest insertion's number s (from 1) satisfies
//! s + C > T. Within a request the hits are its contiguous present prefix (no insertion happens
//! before the first miss), then every missing node is inserted in order, as the replay does.

use super::CapacityTotals;
use super::policy::Event;

/// Capacities swept together in one walk.
const LANES: usize = 2;

/// FIFO over every pass of `events` (delimited by `starts`) at each of `capacities` (any order;
/// 0 caches nothing); only the passes `counted` says count. One [`CapacityTotals`] per capacity, in
/// order. `None` when the insertions could outnumber a stamp (2^32 − 1 events); the caller
/// replays then.
pub fn fifo_sweep(
    node_count: usize,
    events: &[Event],
    starts: &[usize],
    capacities: &[u64],
    counted: impl Fn(usize) -> bool,
) -> Option<Vec<CapacityTotals>> {
    if u32::try_from(events.len()).ok()? == u32::MAX {
        return None;
    }
    let mut totals = vec![CapacityTotals::default(); capacities.len()];
    // Two capacities per walk: `stamps[2 * node + lane]` is the number (from 1) of the node's
    // latest insertion at the lane's capacity, 0 for none yet, so one event's two stamps share
    // a cache line. One array for every pair in turn, so the memory is touched once.
    let mut stamps: Vec<u32> = Vec::new();
    let passes = starts.len().saturating_sub(1);
    for (pair, totals) in capacities.chunks(LANES).zip(totals.chunks_mut(LANES)) {
        stamps.clear();
        stamps.resize(node_count.checked_mul(LANES)?, 0);
        let mut insertions = [0u64; LANES];
        for pass in 0..passes {
            let counts = counted(pass);
            let mut hitting = [true; LANES];
            for event in &events[starts[pass]..starts[pass + 1]] {
                let at = event.node() as usize * LANES;
                let Some(node_stamps) = stamps.get_mut(at..at + LANES) else {
                    continue;
                };
                for (lane, &capacity) in pair.iter().enumerate() {
                    let stamp = &mut node_stamps[lane];
                    // A stamp is at most the insertions: no sum to overflow at a capacity near
                    // u64::MAX.
                    if *stamp != 0 && insertions[lane] - u64::from(*stamp) < capacity {
                        if hitting[lane] && counts {
                            totals[lane].hit_tokens += u64::from(event.tokens);
                            if event.seen_in_conversation() {
                                totals[lane].same_conversation_tokens += u64::from(event.tokens);
                            }
                        }
                        continue;
                    }
                    hitting[lane] = false;
                    insertions[lane] += 1;
                    // Below 2^32 - 1: one insertion per event at most.
                    *stamp = u32::try_from(insertions[lane]).unwrap_or(u32::MAX);
                    if insertions[lane] == capacity {
                        totals[lane].full_since = Some(pass as u64);
                    }
                }
            }
        }
    }
    Some(totals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::lru_stack::tests::generated;
    use crate::cache::policy::Fifo;

    #[test]
    fn equals_the_replay_at_every_capacity() {
        for seed in 1..40u64 {
            let (parents, events, starts) = generated(seed, 300);
            let capacities = [
                0u64,
                1,
                2,
                3,
                7,
                20,
                64,
                200,
                700,
                5000,
                u64::MAX - 3,
                u64::MAX,
            ];
            let counted = |pass: usize| pass >= 100;
            let swept =
                fifo_sweep(parents.len(), &events, &starts, &capacities, counted).expect("small");
            assert!(swept[1].hit_tokens < swept[9].hit_tokens, "seed {seed}");
            for (&capacity, sweep) in capacities.iter().zip(&swept) {
                let mut fifo = Fifo::new(usize::try_from(capacity).unwrap_or(usize::MAX));
                let mut replay = CapacityTotals::default();
                for pass in 0..starts.len() - 1 {
                    let served = fifo.serve(parents.len(), &events[starts[pass]..starts[pass + 1]]);
                    if counted(pass) {
                        replay.hit_tokens += served.hit_tokens;
                        replay.same_conversation_tokens += served.same_conversation_tokens;
                    }
                }
                replay.full_since = fifo.full_since();
                assert_eq!(*sweep, replay, "seed {seed}, capacity {capacity}");
            }
            // Capacities are swept in pairs: an odd count, in another order, leaves one alone.
            let odd = [700u64, 1, 5000, 3, 64, 0, 20];
            let swept_odd =
                fifo_sweep(parents.len(), &events, &starts, &odd, counted).expect("small");
            for (capacity, sweep) in odd.iter().zip(&swept_odd) {
                let position = capacities.iter().position(|c| c == capacity);
                assert_eq!(Some(sweep), position.map(|p| &swept[p]), "seed {seed}");
            }
            assert_eq!(
                fifo_sweep(parents.len(), &events, &starts, &[], counted),
                Some(Vec::new())
            );
        }
    }
}
