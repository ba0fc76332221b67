//! One copy of each distinct value: the analysis engine's messages and tool lists, the profile's
//! prompt texts. Each request re-sends its conversation, so a holder of many requests held each
//! value once per turn that re-sent it.

use std::collections::HashMap;
use std::sync::Arc;

/// Values kept once each, shared by every holder of an equal one, under a 64-bit key (of their
/// hash or their content: a string key cost a second copy of every hash). Values with equal
/// keys that differ in any field are each kept.
#[derive(Debug)]
pub struct Shared<T: ?Sized> {
    /// The first value under each key.
    first: HashMap<u64, Arc<T>>,
    /// The others, rare: equal hashes with different counts, or two hashes under one key.
    others: HashMap<u64, Vec<Arc<T>>>,
}

impl<T: ?Sized> Default for Shared<T> {
    fn default() -> Self {
        Shared {
            first: HashMap::new(),
            others: HashMap::new(),
        }
    }
}

impl<T: ?Sized + PartialEq> Shared<T> {
    /// Replaces `value` by the copy already kept when one is equal in every field; true when
    /// `value` itself is kept now (no equal one was).
    pub fn share(&mut self, key: u64, value: &mut Arc<T>) -> bool {
        let mut kept = false;
        let first = self.first.entry(key).or_insert_with(|| {
            kept = true;
            Arc::clone(value)
        });
        if kept {
            return true;
        }
        if Arc::ptr_eq(first, value) || **first == **value {
            *value = Arc::clone(first);
            return false;
        }
        let others = self.others.entry(key).or_default();
        match others.iter().find(|k| ***k == **value) {
            Some(k) => {
                *value = Arc::clone(k);
                false
            }
            None => {
                others.push(Arc::clone(value));
                true
            }
        }
    }

    /// Each value kept, once.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.others.values().map(Vec::len).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_under_one_key_that_differ_are_each_kept() {
        let mut shared: Shared<str> = Shared::default();
        let (mut a, mut b, mut a_again) = (Arc::from("a"), Arc::from("b"), Arc::from("a"));
        assert!(shared.share(7, &mut a));
        assert!(shared.share(7, &mut b));
        assert!(!shared.share(7, &mut a_again));
        let mut b_again: Arc<str> = Arc::from("b");
        assert!(!shared.share(7, &mut b_again));
        assert_eq!(shared.len(), 2);
        assert!(Arc::ptr_eq(&a, &a_again) && Arc::ptr_eq(&b, &b_again));
        assert_eq!((&*a, &*b), ("a", "b"));
    }
}
