//! The coordination store the cluster's roles share: a small trait over the part of
//! the etcd v3 API that sluice uses (and that etcd 3.4, 3.5 and 3.6 all serve), with
//! etcd as its real implementation ([`EtcdStore`]), an in-memory one for unit
//! tests ([`MemStore`]), and that one behind a modelled network ([`SimNet`]) for
//! clusters simulated in virtual time.
//!
//! What the roles need, and nothing else: single keys (get, put, delete), a prefix
//! listed at one revision, a watch of a prefix from a revision (ending with
//! [`StoreError::Compacted`] when that revision is gone, so the watcher re-lists),
//! transactions of equality compares and puts/deletes (the guarded publication of a
//! routing table, the election), and leases (grant, one keep-alive, revoke) that
//! delete their keys when they lapse.

mod etcd;
mod link;
mod mem;

use std::future::Future;
use std::pin::Pin;

use thiserror::Error;

pub use etcd::{EtcdCredentials, EtcdStore, ENV_PASSWORD, ENV_PASSWORD_FILE, ENV_USER, ETCD_KEEP_ALIVE};
pub use link::{Link, NetModel, NetStats, SimNet};
pub use mem::MemStore;

/// A boxed future, so the trait is object safe (`Arc<dyn Store>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A lease's id (etcd's `int64`; 0 is "no lease").
pub type LeaseId = i64;

/// A store operation failed.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The store could not be reached, or did not answer in time.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A watch asked for history that compaction removed: re-list, then watch from
    /// the listing's revision + 1.
    #[error("watch from revision {requested}: compacted up to revision {compacted}")]
    Compacted {
        /// The revision the watch started at.
        requested: i64,
        /// The store's compaction revision: history before it is gone.
        compacted: i64,
    },
    /// The lease has expired or was revoked (its keys are gone).
    #[error("lease {0:x} expired or was revoked")]
    LeaseExpired(LeaseId),
    /// The store refused the request (a bad argument, a server error).
    #[error("store: {0}")]
    Refused(String),
    /// etcd's authentication refused it: no credentials where auth is on, wrong
    /// ones, or a user whose role does not cover the key.
    #[error("etcd auth: {0}")]
    Auth(String),
}

/// One key and its value, with etcd's revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value (empty in a delete event).
    pub value: Vec<u8>,
    /// Revision of the key's creation.
    pub create_revision: i64,
    /// Revision of its last change (of the deletion, in a delete event).
    pub mod_revision: i64,
    /// Its lease (0: none).
    pub lease: LeaseId,
}

/// The keys under a prefix at one revision.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// The keys, ascending.
    pub kvs: Vec<KeyValue>,
    /// The store's revision the listing was read at: watch from `revision + 1` to
    /// see every later change exactly once.
    pub revision: i64,
}

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Created or changed.
    Put,
    /// Deleted (explicitly, or because its lease lapsed).
    Delete,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change (for a delete: the key, no value, the deletion's revision).
    pub kv: KeyValue,
}

/// A watch's stream of events, in revision order. Dropping it cancels the watch.
pub struct Watch {
    rx: tokio::sync::mpsc::Receiver<Result<Event, StoreError>>,
    _cancel: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Watch {
    /// The next event; `Err` ends the watch (`Compacted`: re-list and watch again;
    /// `Unavailable`: the store went away for longer than the watch retries).
    /// `None`: the store dropped the watch.
    pub async fn next(&mut self) -> Option<Result<Event, StoreError>> {
        self.rx.recv().await
    }
}

/// An equality compare in a transaction.
#[derive(Clone, Debug)]
pub enum Compare {
    /// The key does not exist (etcd: `create_revision == 0`).
    Absent(String),
    /// The key holds exactly this value.
    Value(String, Vec<u8>),
    /// The key's last change was at this revision (0: it does not exist).
    ModRevision(String, i64),
}

/// A write in a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    /// Put a value, under a lease or none.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease its life is bound to.
        lease: Option<LeaseId>,
    },
    /// Delete a key.
    Delete(String),
}

/// A transaction: if every compare holds, `then`, else `otherwise`, atomically.
#[derive(Clone, Debug, Default)]
pub struct Txn {
    /// The compares (all must hold).
    pub when: Vec<Compare>,
    /// Writes when they hold.
    pub then: Vec<Op>,
    /// Writes when one does not.
    pub otherwise: Vec<Op>,
}

/// What a transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Whether the compares held (`then` ran).
    pub succeeded: bool,
    /// The store's revision after it.
    pub revision: i64,
}

/// The part of etcd v3 the cluster uses (see the module docs).
pub trait Store: Send + Sync + 'static {
    /// One key (None: absent).
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyValue>, StoreError>>;
    /// Puts a value (bound to `lease` when given); returns the new revision.
    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'a, Result<i64, StoreError>>;
    /// Deletes a key (absent is fine); returns the new revision.
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<i64, StoreError>>;
    /// Every key under `prefix`, at one revision.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>>;
    /// Runs a transaction.
    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, StoreError>>;
    /// Watches `prefix` from `from_revision` (inclusive; 0: from now on).
    fn watch<'a>(&'a self, prefix: &'a str, from_revision: i64) -> BoxFuture<'a, Result<Watch, StoreError>>;
    /// Grants a lease of `ttl_s` seconds.
    fn grant(&self, ttl_s: i64) -> BoxFuture<'_, Result<LeaseId, StoreError>>;
    /// Renews a lease once (its TTL starts again), or `LeaseExpired`.
    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Revokes a lease (its keys are deleted at once).
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Compacts history up to `revision` (operators and tests; etcd also compacts itself
    /// when run with `--auto-compaction-retention`).
    fn compact(&self, revision: i64) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// The exclusive end of the key range under `prefix` (etcd's prefix range end).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
