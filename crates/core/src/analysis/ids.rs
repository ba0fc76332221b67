//! Lookups a report makes for every row, kept cheap: rows by id (a recording numbers its records
//! from 1, so mostly by index), and hash maps keyed by small integers (interned ids), which
//! need no DoS-resistant hash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Values by row id; the last one given for an id wins (as collecting into a map does).
pub(crate) enum ById<T> {
    Dense(Vec<Option<T>>),
    Sparse(HashMap<u64, T>),
}

impl<T: Copy> ById<T> {
    pub(crate) fn new(pairs: impl Iterator<Item = (u64, T)> + Clone) -> ById<T> {
        let (mut max, mut count) = (0u64, 0usize);
        for (id, _) in pairs.clone() {
            max = max.max(id);
            count += 1;
        }
        // By index while that costs no more than a few slots per row.
        match usize::try_from(max) {
            Ok(max) if max <= count.saturating_mul(4) + 1024 => {
                let mut slots = vec![None; max + 1];
                for (id, value) in pairs {
                    slots[id as usize] = Some(value);
                }
                ById::Dense(slots)
            }
            _ => ById::Sparse(pairs.collect()),
        }
    }

    pub(crate) fn get(&self, id: u64) -> Option<T> {
        match self {
            ById::Dense(slots) => usize::try_from(id)
                .ok()
                .and_then(|i| slots.get(i).copied().flatten()),
            ById::Sparse(map) => map.get(&id).copied(),
        }
    }
}

/// FxHash's mix (rustc's): a rotate, a xor and a multiply per word.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        // A word at a time: strings (client labels, models) are keys too.
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(word) ^ (rest.len() as u64) << 59);
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(SEED);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash map keyed by interned ids, row ids or short strings: nothing an attacker picks
/// collides by design here, and SipHash was a tenth of a report's cost.
pub(crate) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_value_of_an_id_wins_dense_or_sparse() {
        let dense = ById::new([(1, 'a'), (2, 'b'), (1, 'c')].into_iter());
        assert_eq!(
            (dense.get(1), dense.get(2), dense.get(3)),
            (Some('c'), Some('b'), None)
        );
        let sparse = ById::new([(1 << 40, 'a'), (7, 'b'), (1 << 40, 'c')].into_iter());
        assert!(matches!(sparse, ById::Sparse(_)));
        assert_eq!(
            (sparse.get(1 << 40), sparse.get(7), sparse.get(8)),
            (Some('c'), Some('b'), None)
        );
    }
}
