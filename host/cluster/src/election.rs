//! Electing the one active allocator: a transaction on the lease (etcd's own
//! election recipe, reduced to what sluice needs). A candidate puts its id at the
//! election key under its lease if the key is absent; whoever holds the key leads
//! until its lease lapses or it resigns, and every write a leader makes is guarded
//! by a compare on the key's value, so a deposed leader's late writes fail.

use crate::store::{Compare, EventKind, LeaseId, Op, Store, StoreError, Txn};

/// Campaigns for `key` as `id` under `lease` until elected (returns Ok) or the
/// store fails. Waiting candidates watch the key and try again when it is deleted.
pub async fn campaign(store: &dyn Store, key: &str, id: &str, lease: LeaseId) -> Result<(), StoreError> {
    loop {
        let won = store
            .txn(Txn {
                when: vec![Compare::Absent(key.to_string())],
                then: vec![Op::Put { key: key.to_string(), value: id.as_bytes().to_vec(), lease: Some(lease) }],
                otherwise: vec![],
            })
            .await?;
        if won.succeeded {
            return Ok(());
        }
        // Someone leads: wait for the key to go (their lease lapsed, or they resigned).
        let current = store.get(key).await?;
        let Some(kv) = current else { continue };
        if kv.value == id.as_bytes() && kv.lease == lease {
            return Ok(());
        }
        let mut watch = match store.watch(key, kv.mod_revision + 1).await {
            Ok(w) => w,
            Err(StoreError::Compacted { .. }) => continue,
            Err(e) => return Err(e),
        };
        loop {
            match watch.next().await {
                Some(Ok(ev)) if ev.kind == EventKind::Delete && ev.kv.key == key => break,
                Some(Ok(_)) => {}
                Some(Err(StoreError::Compacted { .. })) | None => break,
                Some(Err(e)) => return Err(e),
            }
        }
    }
}

/// The current leader's id (None: no leader).
pub async fn leader(store: &dyn Store, key: &str) -> Result<Option<String>, StoreError> {
    Ok(store.get(key).await?.map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
}

/// Resigns (deletes the key if `id` holds it), so another candidate takes over at
/// once rather than after the lease's TTL.
pub async fn resign(store: &dyn Store, key: &str, id: &str) -> Result<(), StoreError> {
    store
        .txn(Txn {
            when: vec![Compare::Value(key.to_string(), id.as_bytes().to_vec())],
            then: vec![Op::Delete(key.to_string())],
            otherwise: vec![],
        })
        .await?;
    Ok(())
}

/// The compare that guards a leader's writes: `id` still holds `key`.
pub fn still_leader(key: &str, id: &str) -> Compare {
    Compare::Value(key.to_string(), id.as_bytes().to_vec())
}
