//! [`SimNet`] and its [`Link`]s: a [`Store`] as the nodes of a cluster see it across
//! a network, for whole clusters run in virtual time (`crate::simulate`). Every call
//! takes a round trip; writes queue at one server, one after another, as etcd's raft
//! log applies them; watch events reach a node half a round trip after they happen;
//! and each node's link can be cut and healed (a partition of that node).
//!
//! All delays are tokio sleeps, so on a paused clock they cost no wall time and the
//! figures are the model's, not this machine's. tokio's timers tick in milliseconds:
//! a delay ends on the first tick at or after its instant, so a leg of a round trip
//! shorter than 1 ms takes 1 ms (round trips of 2 ms model exactly).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::time::{Duration, Instant};

use super::{BoxFuture, KeyValue, LeaseId, Listing, Store, StoreError, Txn, TxnOutcome, Watch};

/// The network and server the nodes share.
#[derive(Clone, Copy, Debug)]
pub struct NetModel {
    /// A round trip between a node and the store.
    pub rtt: Duration,
    /// The server's time per write (put, transaction, lease grant, keep-alive,
    /// revoke): writes wait for one another, reads do not.
    pub write: Duration,
    /// How long a call across a cut link waits before failing `Unavailable` (the
    /// etcd client's request timeout).
    pub timeout: Duration,
}

/// What crossed the network (all links together).
#[derive(Debug, Default)]
pub struct NetStats {
    /// Reads (get, list, watch creation).
    pub reads: AtomicU64,
    /// Writes, each one server turn.
    pub writes: AtomicU64,
    /// Watch events delivered to nodes.
    pub events: AtomicU64,
}

/// A store behind a modelled network; [`SimNet::link`] gives each node its own link.
pub struct SimNet {
    store: Arc<dyn Store>,
    model: NetModel,
    server: Arc<parking_lot::Mutex<Instant>>,
    /// Its counters.
    pub stats: Arc<NetStats>,
}

impl SimNet {
    /// The network in front of `store`.
    pub fn new(store: Arc<dyn Store>, model: NetModel) -> SimNet {
        SimNet { store, model, server: Arc::new(parking_lot::Mutex::new(Instant::now())), stats: Arc::default() }
    }

    /// A new node's link (not cut).
    pub fn link(&self) -> Arc<Link> {
        Arc::new(Link {
            store: self.store.clone(),
            model: self.model,
            server: self.server.clone(),
            stats: self.stats.clone(),
            cut: Arc::new(tokio::sync::watch::Sender::new(false)),
        })
    }
}

/// One node's view of the store (see the module docs).
pub struct Link {
    store: Arc<dyn Store>,
    model: NetModel,
    /// When the server is free of the writes queued so far.
    server: Arc<parking_lot::Mutex<Instant>>,
    stats: Arc<NetStats>,
    cut: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Link {
    /// Cuts (true) or heals (false) this node's link. Calls in flight finish; new
    /// ones and watch events wait for the timeout and fail.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }

    /// The way there: half a round trip, or the timeout and `Unavailable` when cut.
    async fn there(&self) -> Result<(), StoreError> {
        if self.is_cut() {
            tokio::time::sleep(self.model.timeout).await;
            return Err(StoreError::Unavailable("simulated partition".into()));
        }
        tokio::time::sleep(self.model.rtt / 2).await;
        Ok(())
    }

    async fn read<T>(&self, f: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        self.there().await?;
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        let r = f.await;
        tokio::time::sleep(self.model.rtt / 2).await;
        r
    }

    async fn write<T>(&self, f: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        self.there().await?;
        // The server's queue as a schedule: this write is done one turn after the
        // writes before it. (tokio's timers tick in milliseconds, so it completes on
        // the tick after that instant; the schedule itself keeps the sub-millisecond
        // turns, so queueing does not round up write by write.)
        let done = {
            let mut free = self.server.lock();
            *free = (*free).max(Instant::now()) + self.model.write;
            *free
        };
        tokio::time::sleep_until(done).await;
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        let r = f.await;
        tokio::time::sleep(self.model.rtt / 2).await;
        r
    }
}

impl Store for Link {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyValue>, StoreError>> {
        Box::pin(self.read(self.store.get(key)))
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(self.write(self.store.put(key, value, lease)))
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(self.write(self.store.delete(key)))
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>> {
        Box::pin(self.read(self.store.list(prefix)))
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, StoreError>> {
        Box::pin(self.write(self.store.txn(txn)))
    }

    fn watch<'a>(&'a self, prefix: &'a str, from_revision: i64) -> BoxFuture<'a, Result<Watch, StoreError>> {
        Box::pin(async move {
            let mut inner = self.read(self.store.watch(prefix, from_revision)).await?;
            // Each event reaches the node half a round trip after it happened; a cut
            // link ends the watch with `Unavailable` after the timeout, as a client's
            // keep-alive would, and the node's mirror re-lists once healed.
            let (tx, rx) = tokio::sync::mpsc::channel(256);
            let (half, timeout) = (self.model.rtt / 2, self.model.timeout);
            let (mut cut, stats) = (self.cut.subscribe(), self.stats.clone());
            // Stamped as they happen (a burst arrives together, not one after another).
            let (stamped_tx, mut stamped) = tokio::sync::mpsc::unbounded_channel();
            let stamp = tokio::spawn(async move {
                while let Some(ev) = inner.next().await {
                    if stamped_tx.send((Instant::now() + half, ev)).is_err() {
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let unavailable = || Err(StoreError::Unavailable("simulated partition".into()));
                loop {
                    let next = tokio::select! {
                        ev = stamped.recv() => ev,
                        _ = cut.wait_for(|c| *c) => None,
                    };
                    let Some((at, ev)) = next.filter(|_| !*cut.borrow()) else {
                        if *cut.borrow() {
                            tokio::time::sleep(timeout).await;
                            let _ = tx.send(unavailable()).await;
                        }
                        break;
                    };
                    tokio::time::sleep_until(at).await;
                    stats.events.fetch_add(1, Ordering::Relaxed);
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
                stamp.abort();
            });
            Ok(Watch { rx, _cancel: None })
        })
    }

    fn grant(&self, ttl_s: i64) -> BoxFuture<'_, Result<LeaseId, StoreError>> {
        Box::pin(self.write(self.store.grant(ttl_s)))
    }

    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.write(self.store.keep_alive(lease)))
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.write(self.store.revoke(lease)))
    }

    fn compact(&self, revision: i64) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.write(self.store.compact(revision)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[tokio::test(start_paused = true)]
    async fn calls_take_a_round_trip_writes_queue_and_a_cut_link_times_out() {
        let model = NetModel {
            rtt: Duration::from_millis(2),
            write: Duration::from_millis(1),
            timeout: Duration::from_secs(3),
        };
        let net = SimNet::new(Arc::new(MemStore::new()), model);
        let (a, b) = (net.link(), net.link());
        let t0 = Instant::now();
        a.get("/x").await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_millis(2));
        // Two writes at once: the second waits for the first's server turn.
        let t0 = Instant::now();
        let (ra, rb) = tokio::join!(a.put("/x", b"1".to_vec(), None), b.put("/y", b"2".to_vec(), None));
        assert!(ra.is_ok() && rb.is_ok());
        assert_eq!(t0.elapsed(), Duration::from_millis(4));
        // A watch sees a write half a round trip after the write applied.
        let mut w = b.watch("/z", 0).await.unwrap();
        let t0 = Instant::now();
        a.put("/z", b"3".to_vec(), None).await.unwrap();
        let ev = w.next().await.unwrap().unwrap();
        assert_eq!(ev.kv.key, "/z");
        assert_eq!(t0.elapsed(), Duration::from_millis(3)); // 1 + 1 (write) + 1 (event)
        a.set_cut(true);
        let t0 = Instant::now();
        assert!(matches!(a.get("/x").await, Err(StoreError::Unavailable(_))));
        assert_eq!(t0.elapsed(), Duration::from_secs(3));
        assert!(b.get("/x").await.unwrap().is_some(), "the other node's link is not cut");
        a.set_cut(false);
        assert!(a.get("/x").await.unwrap().is_some());
        assert_eq!(net.stats.writes.load(Ordering::Relaxed), 3);
    }
}
