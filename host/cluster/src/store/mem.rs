//! [`MemStore`]: an in-memory [`Store`] for unit tests of the roles' logic. It keeps
//! etcd's semantics that the roles depend on — one revision counter, watches from a
//! revision with compaction, transactions, leases whose lapse deletes their keys —
//! and nothing else (no persistence, no cluster). Leases lapse on tokio's clock, so
//! tests may pause time.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::{Duration, Instant};

use super::{
    BoxFuture, Compare, Event, EventKind, KeyValue, LeaseId, Listing, Op, Store, StoreError, Txn, TxnOutcome, Watch,
};

/// An in-memory [`Store`] (unit tests only; see the module docs).
#[derive(Clone, Default)]
pub struct MemStore {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    revision: i64,
    compacted: i64,
    kvs: BTreeMap<String, KeyValue>,
    history: Vec<Event>,
    watchers: Vec<(String, tokio::sync::mpsc::UnboundedSender<Result<Event, StoreError>>)>,
    leases: BTreeMap<LeaseId, (Duration, Instant)>,
    next_lease: LeaseId,
}

impl Inner {
    /// Deletes the keys of leases past their deadline (one revision per key, as etcd).
    fn expire(&mut self) {
        let now = Instant::now();
        let lapsed: Vec<LeaseId> = self.leases.iter().filter(|(_, (_, at))| *at <= now).map(|(id, _)| *id).collect();
        for id in lapsed {
            self.drop_lease(id);
        }
    }

    fn drop_lease(&mut self, id: LeaseId) {
        self.leases.remove(&id);
        let keys: Vec<String> = self.kvs.values().filter(|kv| kv.lease == id).map(|kv| kv.key.clone()).collect();
        for k in keys {
            self.revision += 1;
            self.remove(&k);
        }
    }

    fn check(&self, c: &Compare) -> bool {
        match c {
            Compare::Absent(k) => !self.kvs.contains_key(k),
            Compare::Value(k, v) => self.kvs.get(k).is_some_and(|kv| &kv.value == v),
            Compare::ModRevision(k, r) => self.kvs.get(k).map_or(0, |kv| kv.mod_revision) == *r,
        }
    }

    /// Applies one write at the current revision (the caller bumped it).
    fn apply(&mut self, op: &Op) -> Result<(), StoreError> {
        match op {
            Op::Put { key, value, lease } => {
                if let Some(l) = lease {
                    if !self.leases.contains_key(l) {
                        return Err(StoreError::LeaseExpired(*l));
                    }
                }
                let create = self.kvs.get(key).map_or(self.revision, |kv| kv.create_revision);
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: create,
                    mod_revision: self.revision,
                    lease: lease.unwrap_or(0),
                };
                self.kvs.insert(key.clone(), kv.clone());
                self.emit(Event { kind: EventKind::Put, kv });
            }
            Op::Delete(k) => self.remove(k),
        }
        Ok(())
    }

    fn remove(&mut self, k: &str) {
        if self.kvs.remove(k).is_some() {
            let kv = KeyValue {
                key: k.to_string(),
                value: Vec::new(),
                create_revision: 0,
                mod_revision: self.revision,
                lease: 0,
            };
            self.emit(Event { kind: EventKind::Delete, kv });
        }
    }

    fn emit(&mut self, ev: Event) {
        self.watchers.retain(|(prefix, tx)| !ev.kv.key.starts_with(prefix.as_str()) || tx.send(Ok(ev.clone())).is_ok());
        self.history.push(ev);
    }
}

impl MemStore {
    /// An empty store at revision 0.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Expires leases at their deadlines, as etcd's lessor does, rather than at the
    /// next call (what unit tests get without it): a task until the handle is
    /// aborted. Simulated clusters (`crate::simulate`) run it so that a dead node's
    /// keys go exactly one TTL after its last keep-alive.
    pub fn expire_leases_on_time(&self) -> tokio::task::JoinHandle<()> {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            loop {
                let next = {
                    let mut g = inner.lock();
                    g.expire();
                    g.leases.values().map(|(_, at)| *at).min()
                };
                // A lease granted meanwhile lapses no sooner than 1 s from its grant.
                let recheck = Instant::now() + Duration::from_millis(250);
                tokio::time::sleep_until(next.map_or(recheck, |n| n.min(recheck))).await;
            }
        })
    }

    fn locked<T>(&self, f: impl FnOnce(&mut Inner) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut g = self.inner.lock();
        g.expire();
        f(&mut g)
    }
}

impl Store for MemStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyValue>, StoreError>> {
        Box::pin(async move { self.locked(|s| Ok(s.kvs.get(key).cloned())) })
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(async move {
            self.locked(|s| {
                if let Some(l) = lease {
                    if !s.leases.contains_key(&l) {
                        return Err(StoreError::LeaseExpired(l));
                    }
                }
                s.revision += 1;
                s.apply(&Op::Put { key: key.to_string(), value, lease })?;
                Ok(s.revision)
            })
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(async move {
            self.locked(|s| {
                if s.kvs.contains_key(key) {
                    s.revision += 1;
                    s.remove(key);
                }
                Ok(s.revision)
            })
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>> {
        Box::pin(async move {
            self.locked(|s| {
                let kvs = s
                    .kvs
                    .range(prefix.to_string()..)
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .map(|(_, v)| v.clone());
                Ok(Listing { kvs: kvs.collect(), revision: s.revision })
            })
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, StoreError>> {
        Box::pin(async move {
            self.locked(|s| {
                let succeeded = txn.when.iter().all(|c| s.check(c));
                let ops = if succeeded { &txn.then } else { &txn.otherwise };
                for op in ops {
                    if let Op::Put { lease: Some(l), .. } = op {
                        if !s.leases.contains_key(l) {
                            return Err(StoreError::LeaseExpired(*l));
                        }
                    }
                }
                if !ops.is_empty() {
                    s.revision += 1;
                }
                for op in ops {
                    s.apply(op)?;
                }
                Ok(TxnOutcome { succeeded, revision: s.revision })
            })
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str, from_revision: i64) -> BoxFuture<'a, Result<Watch, StoreError>> {
        Box::pin(async move {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            self.locked(|s| {
                if from_revision > 0 && from_revision <= s.compacted {
                    return Err(StoreError::Compacted { requested: from_revision, compacted: s.compacted });
                }
                if from_revision > 0 {
                    for ev in s.history.iter().filter(|e| e.kv.mod_revision >= from_revision) {
                        if ev.kv.key.starts_with(prefix) {
                            let _ = tx.send(Ok(ev.clone()));
                        }
                    }
                }
                s.watchers.push((prefix.to_string(), tx));
                Ok(())
            })?;
            // The trait's channel is bounded; forward the unbounded one into it so the
            // store's lock is never held waiting for a slow reader.
            let (out, rx_out) = tokio::sync::mpsc::channel(256);
            tokio::spawn(async move {
                let mut rx = rx;
                while let Some(ev) = rx.recv().await {
                    if out.send(ev).await.is_err() {
                        return;
                    }
                }
            });
            Ok(Watch { rx: rx_out, _cancel: None })
        })
    }

    fn grant(&self, ttl_s: i64) -> BoxFuture<'_, Result<LeaseId, StoreError>> {
        Box::pin(async move {
            self.locked(|s| {
                s.next_lease += 1;
                let ttl = Duration::from_secs(ttl_s.max(1) as u64);
                s.leases.insert(s.next_lease, (ttl, Instant::now() + ttl));
                Ok(s.next_lease)
            })
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.locked(|s| match s.leases.get_mut(&lease) {
                Some((ttl, at)) => {
                    *at = Instant::now() + *ttl;
                    Ok(())
                }
                None => Err(StoreError::LeaseExpired(lease)),
            })
        })
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.locked(|s| {
                s.drop_lease(lease);
                Ok(())
            })
        })
    }

    fn compact(&self, revision: i64) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.locked(|s| {
                if revision > s.revision {
                    return Err(StoreError::Refused(format!("compact to {revision}: the store is at {}", s.revision)));
                }
                s.compacted = s.compacted.max(revision);
                let keep = s.compacted;
                s.history.retain(|e| e.kv.mod_revision > keep);
                Ok(())
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn leases_lapse_and_compaction_refuses_old_watches() {
        let s = MemStore::new();
        let lease = s.grant(1).await.unwrap();
        s.put("/k/a", b"1".to_vec(), Some(lease)).await.unwrap();
        let rev = s.put("/k/b", b"2".to_vec(), None).await.unwrap();
        let mut w = s.watch("/k/", rev + 1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        s.keep_alive(lease).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(s.get("/k/a").await.unwrap().is_some(), "renewed 0.6 s ago with a 1 s TTL");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(s.get("/k/a").await.unwrap().is_none(), "lapsed");
        let ev = w.next().await.unwrap().unwrap();
        assert_eq!((ev.kind, ev.kv.key.as_str()), (EventKind::Delete, "/k/a"));
        assert!(matches!(s.keep_alive(lease).await, Err(StoreError::LeaseExpired(l)) if l == lease));
        assert!(matches!(s.put("/k/c", vec![], Some(lease)).await, Err(StoreError::LeaseExpired(_))));
        s.compact(rev).await.unwrap();
        assert!(matches!(s.watch("/k/", rev).await, Err(StoreError::Compacted { compacted, .. }) if compacted == rev));
        let t = s
            .txn(Txn {
                when: vec![Compare::Absent("/k/b".into())],
                then: vec![Op::Delete("/k/b".into())],
                otherwise: vec![Op::Put { key: "/k/z".into(), value: b"else".to_vec(), lease: None }],
            })
            .await
            .unwrap();
        assert!(!t.succeeded);
        assert_eq!(s.get("/k/z").await.unwrap().unwrap().value, b"else");
    }
}
