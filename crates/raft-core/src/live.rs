//! The registry of live objects behind `resources.rs`'s `live_registry` (every resources object
//! alive, for the exit teardown and for [`crate::stats`]): a slot each, which the object keeps,
//! reused once its object is gone. Making and dropping an object costs a lock and a slot, no
//! hashing. Generic, so that it names nothing above it.
use std::sync::{Arc, Weak};

pub(crate) struct LiveRegistry<T> {
    slots: Vec<Option<Weak<T>>>,
    free: Vec<usize>,
}

impl<T> LiveRegistry<T> {
    pub(crate) const fn new() -> Self {
        LiveRegistry { slots: Vec::new(), free: Vec::new() }
    }

    /// Takes a slot for `state`; returns its number, which [`remove`](Self::remove) frees.
    pub(crate) fn insert(&mut self, state: Weak<T>) -> usize {
        match self.free.pop() {
            Some(at) => {
                self.slots[at] = Some(state);
                at
            }
            None => {
                self.slots.push(Some(state));
                self.slots.len() - 1
            }
        }
    }

    pub(crate) fn remove(&mut self, at: usize) {
        if self.slots.get_mut(at).and_then(Option::take).is_some() {
            self.free.push(at);
        }
    }

    /// The objects still alive, a handle each.
    pub(crate) fn alive(&self) -> Vec<Arc<T>> {
        self.slots.iter().flatten().filter_map(Weak::upgrade).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_registry_reuses_a_freed_slot_and_frees_each_slot_once() {
        let mut r = LiveRegistry::<u8>::new();
        let [a, b, c] = [(); 3].map(|()| r.insert(Weak::new()));
        assert_eq!([a, b, c], [0, 1, 2]);
        r.remove(b);
        r.remove(b); // a second removal of the same slot frees nothing more
        r.remove(7); // nor does one of a slot never handed out
        assert_eq!(r.free, vec![b]);
        assert_eq!(r.insert(Weak::new()), b);
        assert_eq!(r.insert(Weak::new()), 3);
        // Objects that are gone are not alive (a `Weak` that never upgrades).
        assert!(r.alive().is_empty());
    }
}
