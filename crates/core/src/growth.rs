//! How the engines' largest vectors grow: by a quarter, not by doubling. They hold a few
//! hundred bytes per record (the analysis engine's exchanges, the live simulation's events), so
//! a doubling past a million records left up to half of several hundred megabytes unused, and
//! held the old and the new buffer, three times the contents, while it copied.

/// Makes room for `more` elements in `vector`, growing it by at least a quarter when it must
/// grow (each element is still copied a bounded number of times: about four on average).
pub fn reserve_by_quarter<T>(vector: &mut Vec<T>, more: usize) {
    if vector.capacity() - vector.len() < more {
        vector.reserve_exact(more.max(vector.len() / 4).max(16));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_a_quarter_and_never_short_of_what_is_asked() {
        let mut vector: Vec<u64> = Vec::new();
        for i in 0..100_000u64 {
            reserve_by_quarter(&mut vector, 1);
            let before = vector.capacity();
            vector.push(i);
            assert_eq!(vector.capacity(), before, "no growth past the reserve");
            assert!(vector.capacity() <= vector.len() + (vector.len() / 4).max(16));
        }
        reserve_by_quarter(&mut vector, 1_000_000);
        assert!(vector.capacity() >= vector.len() + 1_000_000);
    }
}
