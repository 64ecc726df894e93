//! Keeping a lease alive: one task renewing it every third of its TTL, and telling
//! its owner when it is lost (the owner then re-registers under a new lease).

use std::sync::Arc;
use std::time::Duration;

use crate::store::{LeaseId, Store, StoreError};

/// A lease kept alive by a background task; revoked when dropped is not
/// guaranteed (a process killed holds it until its TTL), so owners call
/// [`KeptLease::revoke`] on a clean shutdown.
pub struct KeptLease {
    /// The lease.
    pub id: LeaseId,
    lost: tokio::sync::watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl KeptLease {
    /// Grants a lease of `ttl_s` seconds and starts renewing it.
    pub async fn grant(store: Arc<dyn Store>, ttl_s: i64) -> Result<KeptLease, StoreError> {
        let id = store.grant(ttl_s).await?;
        let (tx, lost) = tokio::sync::watch::channel(false);
        // Renew three times per TTL: one lost or late renewal does not lose the lease.
        let every = Duration::from_millis((ttl_s.max(1) as u64 * 1000) / 3);
        let task = tokio::spawn(async move {
            let deadline_of = |from: tokio::time::Instant| from + Duration::from_secs(ttl_s.max(1) as u64);
            let mut expires = deadline_of(tokio::time::Instant::now());
            loop {
                tokio::time::sleep(every).await;
                let sent = tokio::time::Instant::now();
                match store.keep_alive(id).await {
                    Ok(()) => expires = deadline_of(sent),
                    Err(StoreError::LeaseExpired(_)) => break,
                    Err(e) => {
                        tracing::warn!(lease = id, "lease keep-alive failed: {e}");
                        // The server may still hold it; it is surely gone past its TTL.
                        if tokio::time::Instant::now() >= expires {
                            break;
                        }
                    }
                }
            }
            let _ = tx.send(true);
        });
        Ok(KeptLease { id, lost, task })
    }

    /// Resolves when the lease is lost (expired, or not renewed within its TTL).
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        let _ = rx.wait_for(|l| *l).await;
    }

    /// Whether the lease is lost.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Stops renewing and revokes the lease (its keys go at once).
    pub async fn revoke(self, store: &dyn Store) {
        self.task.abort();
        if let Err(e) = store.revoke(self.id).await {
            tracing::warn!(lease = self.id, "revoking the lease: {e}");
        }
    }
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.task.abort();
    }
}
