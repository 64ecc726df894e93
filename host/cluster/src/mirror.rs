//! A local mirror of the keys under a prefix, kept current by list-then-watch: the
//! way every role reads the store.
//!
//! The mirror lists the prefix (getting the store's revision), then watches from
//! the revision after it, applying each event. When the watch ends because its
//! revision was compacted, the mirror lists again and watches on (the
//! re-list-on-compaction rule); when the store is unreachable, the mirror keeps
//! what it last saw and retries, so a frontend serves on its last plan while etcd is
//! down. Readers get snapshots through a `tokio::sync::watch` channel: a new one
//! after every change.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::store::{EventKind, KeyValue, Store, StoreError};

/// The keys under the prefix, as of `revision`.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Key → value and revisions.
    pub kvs: BTreeMap<String, KeyValue>,
    /// The store revision this snapshot reflects (0: never read).
    pub revision: i64,
    /// Whether the last attempt to read the store succeeded (false: this is the last
    /// state seen before the store became unreachable).
    pub live: bool,
}

/// Counters of a mirror (tests and logs).
#[derive(Debug, Default)]
pub struct MirrorStats {
    /// Full listings (1 at start, then one per compaction or broken watch).
    pub lists: AtomicU64,
    /// Listings forced by compaction.
    pub compactions: AtomicU64,
}

/// A running mirror; dropping it stops the task.
pub struct Mirror {
    rx: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    /// Its counters.
    pub stats: Arc<MirrorStats>,
    task: tokio::task::JoinHandle<()>,
}

/// The pause before retrying an unreachable store.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

impl Mirror {
    /// Starts mirroring `prefix` of `store`.
    pub fn start(store: Arc<dyn Store>, prefix: String) -> Mirror {
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(Snapshot::default()));
        let stats = Arc::new(MirrorStats::default());
        let s = stats.clone();
        let task = tokio::spawn(async move { run(store, prefix, tx, s).await });
        Mirror { rx, stats, task }
    }

    /// A receiver of snapshots (`changed()` wakes on every new one).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Arc<Snapshot>> {
        self.rx.clone()
    }

    /// The latest snapshot.
    pub fn current(&self) -> Arc<Snapshot> {
        self.rx.borrow().clone()
    }

    /// Waits until a snapshot satisfies `f`, at most `within`.
    pub async fn wait_for(&self, within: Duration, f: impl Fn(&Snapshot) -> bool) -> Option<Arc<Snapshot>> {
        let mut rx = self.rx.clone();
        tokio::time::timeout(within, async {
            loop {
                let s = rx.borrow_and_update().clone();
                if f(&s) {
                    return s;
                }
                if rx.changed().await.is_err() {
                    // The task ended (never, while the mirror lives): wait out the timeout.
                    std::future::pending::<()>().await;
                }
            }
        })
        .await
        .ok()
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(
    store: Arc<dyn Store>,
    prefix: String,
    tx: tokio::sync::watch::Sender<Arc<Snapshot>>,
    stats: Arc<MirrorStats>,
) {
    let mut state = Snapshot::default();
    loop {
        // List.
        let listing = match store.list(&prefix).await {
            Ok(l) => l,
            Err(e) => {
                if state.live {
                    tracing::warn!(%prefix, "store unreachable, keeping the last state seen: {e}");
                    state.live = false;
                    let _ = tx.send(Arc::new(state.clone()));
                }
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        stats.lists.fetch_add(1, Ordering::Relaxed);
        state.kvs = listing.kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
        state.revision = listing.revision;
        state.live = true;
        if tx.send(Arc::new(state.clone())).is_err() {
            return;
        }
        // Watch from the revision after the listing.
        let mut watch = match store.watch(&prefix, listing.revision + 1).await {
            Ok(w) => w,
            Err(StoreError::Compacted { .. }) => {
                stats.compactions.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(e) => {
                tracing::debug!(%prefix, "watch failed, listing again: {e}");
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        loop {
            match watch.next().await {
                Some(Ok(ev)) => {
                    state.revision = state.revision.max(ev.kv.mod_revision);
                    match ev.kind {
                        EventKind::Put => {
                            state.kvs.insert(ev.kv.key.clone(), ev.kv);
                        }
                        EventKind::Delete => {
                            state.kvs.remove(&ev.kv.key);
                        }
                    }
                    if tx.send(Arc::new(state.clone())).is_err() {
                        return;
                    }
                }
                Some(Err(StoreError::Compacted { requested, compacted })) => {
                    tracing::info!(%prefix, requested, compacted, "watch compacted: listing again");
                    stats.compactions.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Some(Err(e)) => {
                    tracing::warn!(%prefix, "watch ended: {e}");
                    break;
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[tokio::test]
    async fn a_mirror_follows_puts_and_deletes_and_relists_after_compaction() {
        let store = Arc::new(MemStore::new());
        store.put("/p/a", b"1".to_vec(), None).await.unwrap();
        store.put("/q/x", b"other prefix".to_vec(), None).await.unwrap();
        let m = Mirror::start(store.clone(), "/p/".into());
        let s = m.wait_for(Duration::from_secs(5), |s| s.kvs.contains_key("/p/a")).await.unwrap();
        assert_eq!(s.kvs.len(), 1);
        store.put("/p/b", b"2".to_vec(), None).await.unwrap();
        store.delete("/p/a").await.unwrap();
        let s = m.wait_for(Duration::from_secs(5), |s| !s.kvs.contains_key("/p/a")).await.unwrap();
        assert_eq!(s.kvs.keys().collect::<Vec<_>>(), ["/p/b"]);
        assert_eq!(m.stats.lists.load(Ordering::Relaxed), 1);
    }
}
