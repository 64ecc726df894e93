//! The store the instances of one binding share (`shared-get` / `shared-put` in
//! `wit/policy.wit`).
//!
//! Every worker of an app runs its own instance of the policy, and instances share
//! no memory. Work that depends only on the binding (the component, its `params`
//! and the app) need not be done once per worker: the first instance stores the
//! result, the others read it. RAMSIS keeps its parsed policy tables and the
//! policies it generates for a load here.
//!
//! The rule that keeps a policy deterministic: a value must depend only on its key
//! (and the binding), never on which instance stored it or when. Values are
//! write-once: the first [`put`] of a key wins, which also makes `put` a claim
//! (exactly one of several instances putting the same key gets `true`).
//!
//! On the native target (unit tests, [`testing::Harness`](crate::testing::Harness))
//! the store is per thread: the policies a test creates on one thread share it, as
//! the instances of one binding do; [`testing::clear_shared`](crate::testing::clear_shared)
//! empties it.

/// Longest key the host accepts (bytes); [`put`] refuses longer ones.
pub const MAX_KEY: usize = 1024;

/// The value stored under `key`, if any.
pub fn get(key: &str) -> Option<Vec<u8>> {
    imp::get(key)
}

/// Stores `value` under `key` unless the key is taken (first value wins), longer
/// than [`MAX_KEY`], or the host's byte budget for the store would be exceeded.
/// Returns whether this call stored it.
pub fn put(key: &str, value: &[u8]) -> bool {
    key.len() <= MAX_KEY && imp::put(key, value)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    pub(super) fn get(key: &str) -> Option<Vec<u8>> {
        crate::wit::shared_get(key)
    }

    pub(super) fn put(key: &str, value: &[u8]) -> bool {
        crate::wit::shared_put(key, value)
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod imp {
    use std::cell::RefCell;
    use std::collections::HashMap;

    thread_local! {
        static STORE: RefCell<HashMap<String, Vec<u8>>> = RefCell::new(HashMap::new());
    }

    pub(super) fn get(key: &str) -> Option<Vec<u8>> {
        STORE.with(|s| s.borrow().get(key).cloned())
    }

    pub(super) fn put(key: &str, value: &[u8]) -> bool {
        STORE.with(|s| {
            let mut s = s.borrow_mut();
            if s.contains_key(key) {
                return false;
            }
            s.insert(key.to_owned(), value.to_vec());
            true
        })
    }

    pub(crate) fn clear() {
        STORE.with(|s| s.borrow_mut().clear());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_put_wins_and_long_keys_are_refused() {
        crate::testing::clear_shared();
        assert_eq!(get("k"), None);
        assert!(put("k", b"one"));
        assert!(!put("k", b"two"));
        assert_eq!(get("k").as_deref(), Some(&b"one"[..]));
        assert!(!put(&"x".repeat(MAX_KEY + 1), b""));
        crate::testing::clear_shared();
        assert_eq!(get("k"), None);
    }
}
