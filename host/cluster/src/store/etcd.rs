//! [`EtcdStore`]: the [`Store`] over a real etcd v3 cluster (`etcd-client`).
//!
//! Unary calls are bounded by [`OP_TIMEOUT`] (a store that does not answer is
//! `Unavailable`, and the roles keep running on what they last read). A watch is a
//! task pumping etcd's stream into a channel: when the stream breaks (the member it
//! was on died, the connection dropped), the task opens a new one from the revision
//! after the last event it passed on, so no event is lost or repeated; when etcd
//! says the revision was compacted, the task ends the watch with
//! [`StoreError::Compacted`] and the caller re-lists.
//!
//! With [`EtcdCredentials`] (etcd's users and roles: `etcdctl auth enable`) the
//! client authenticates when it connects and sends the token etcd gave it with
//! every call. etcd forgets its `simple` tokens when a member restarts (and a `jwt`
//! token expires), so a call answered "invalid auth token" authenticates again
//! once and is retried; a watch re-opening after a broken stream does the same.
//! Refusals for want of credentials or rights are [`StoreError::Auth`].

use std::time::Duration;

use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn as EtcdTxn,
    TxnOp, WatchOptions,
};

use super::{
    BoxFuture, Compare, Event, EventKind, KeyValue, LeaseId, Listing, Op, Store, StoreError, Txn, TxnOutcome, Watch,
};

/// How long one unary call may take before the store counts as unavailable. Long
/// enough for an etcd leader election (election timeout 1 s by default) to finish,
/// short enough that a role notices an unreachable store within a lease's TTL.
pub const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a broken watch keeps trying to re-open before it ends with
/// `Unavailable` (the caller then re-lists and watches again, or keeps its state).
const WATCH_RETRY_FOR: Duration = Duration::from_secs(15);

/// The pause between two attempts to re-open a broken watch.
const WATCH_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Events a watch buffers before the pump waits for the reader.
const WATCH_BUFFER: usize = 256;

/// A [`Store`] on etcd v3 (3.4–3.6).
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    /// Whether it authenticates (then an "invalid auth token" answer is worth one
    /// more authentication; without credentials it is final).
    authenticated: bool,
    /// Times it authenticated again after etcd forgot its token (shared by clones).
    reauthenticated: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// A user and password for etcd's authentication (`ConnectOptions::with_user`).
///
/// Roles read them from the environment ([`EtcdCredentials::from_env`]), never
/// from the command line, where any user of the machine could read the password
/// (`/proc/<pid>/cmdline`).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdCredentials {
    /// The etcd user (`sluice` in deploy/kubernetes).
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for EtcdCredentials {
    /// The user only: a password does not belong in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCredentials").field("user", &self.user).field("password", &"…").finish()
    }
}

/// The variable naming the etcd user.
pub const ENV_USER: &str = "SLUICE_ETCD_USER";
/// The variable naming a file whose content (one trailing newline dropped) is the
/// password: a Kubernetes Secret mounted as a volume.
pub const ENV_PASSWORD_FILE: &str = "SLUICE_ETCD_PASSWORD_FILE";
/// The variable holding the password itself (a Secret as `env`), when there is no file.
pub const ENV_PASSWORD: &str = "SLUICE_ETCD_PASSWORD";

/// The environment's etcd credentials are half given or unreadable
/// ([`EtcdCredentials::from_env`]); the message names the variable to set or fix.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The password file cannot be read.
    #[error("{ENV_PASSWORD_FILE}={path}: {source}")]
    PasswordFile {
        /// The file named.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A user without a password.
    #[error("{ENV_USER}={user} without a password: set {ENV_PASSWORD_FILE} (or {ENV_PASSWORD})")]
    NoPassword {
        /// The user named.
        user: String,
    },
    /// A password without a user.
    #[error("an etcd password without a user: set {ENV_USER}")]
    NoUser,
}

impl EtcdCredentials {
    /// The credentials the environment gives ([`ENV_USER`] with [`ENV_PASSWORD_FILE`]
    /// or [`ENV_PASSWORD`]); None without [`ENV_USER`].
    pub fn from_env() -> Result<Option<EtcdCredentials>, CredentialsError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// As [`EtcdCredentials::from_env`], with the variables from `var` (tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<EtcdCredentials>, CredentialsError> {
        let user = var(ENV_USER).filter(|u| !u.is_empty());
        let from_file = var(ENV_PASSWORD_FILE).filter(|p| !p.is_empty());
        let password = match (&from_file, var(ENV_PASSWORD)) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| CredentialsError::PasswordFile { path: path.clone(), source })?;
                // `echo secret > file` and editors add a newline that is no part of it.
                Some(text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text).to_string())
            }
            (None, p) => p,
        };
        match (user, password) {
            (Some(user), Some(password)) => Ok(Some(EtcdCredentials { user, password })),
            (Some(user), None) => Err(CredentialsError::NoPassword { user }),
            (None, Some(_)) => Err(CredentialsError::NoUser),
            (None, None) => Ok(None),
        }
    }
}

impl EtcdStore {
    /// Connects to the members at `endpoints` (`http://127.0.0.1:2379`, ...). The
    /// connection is balanced over all of them, so losing one member (even the
    /// leader) leaves the store usable while a quorum remains.
    pub async fn connect(endpoints: &[String]) -> Result<EtcdStore, StoreError> {
        Self::connect_as(endpoints, None).await
    }

    /// As [`EtcdStore::connect`], authenticating as `credentials` (refused at once,
    /// [`StoreError::Auth`], where etcd does not accept them).
    pub async fn connect_as(
        endpoints: &[String],
        credentials: Option<&EtcdCredentials>,
    ) -> Result<EtcdStore, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Refused("no etcd endpoints given".into()));
        }
        let endpoints: Vec<String> =
            endpoints.iter().map(|e| if e.contains("://") { e.clone() } else { format!("http://{e}") }).collect();
        // HTTP/2 keep-alive pings find a member that died without closing its
        // connections (SIGKILL, a partition) within ETCD_KEEP_ALIVE + 2 s. Not more often:
        // etcd's server takes pings closer than its `--grpc-keepalive-min-time` (5 s
        // by default) on a connection with no data moving as abuse, and closes the
        // connection (GOAWAY `too_many_pings`).
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(ETCD_KEEP_ALIVE, Duration::from_secs(2))
            .with_require_leader(true);
        if let Some(c) = credentials {
            options = options.with_user(c.user.clone(), c.password.clone());
        }
        let client = tokio::time::timeout(OP_TIMEOUT, Client::connect(&endpoints, Some(options)))
            .await
            .map_err(|_| StoreError::Unavailable(format!("connecting to {endpoints:?} timed out")))?
            .map_err(map_err)?;
        Ok(EtcdStore { client, authenticated: credentials.is_some(), reauthenticated: Default::default() })
    }

    /// How many times it authenticated again because etcd no longer knew its token
    /// (a member restarted): what the tests check the retry by.
    pub fn reauthenticated(&self) -> u64 {
        self.reauthenticated.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Authenticates again (see the module docs).
    async fn reauthenticate(&self) -> Result<(), StoreError> {
        self.reauthenticated.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        bounded("etcd authenticate", self.client.refresh_token()).await
    }

    /// One unary call under [`OP_TIMEOUT`], made again once after authenticating
    /// again when etcd no longer knows the token (see the module docs).
    async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T, StoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        match bounded(what, f(self.client.clone())).await {
            Err(StoreError::Auth(m)) if self.authenticated && m.contains(INVALID_TOKEN) => {
                self.reauthenticate().await?;
                bounded(what, f(self.client.clone())).await
            }
            r => r,
        }
    }
}

/// What etcd answers a token it does not know (a member restarted and lost its
/// `simple` tokens, or a `jwt` token expired).
const INVALID_TOKEN: &str = "invalid auth token";

/// The client's HTTP/2 keep-alive interval: above etcd's default
/// `--grpc-keepalive-min-time` (5 s), so that the server never counts it as abuse.
pub const ETCD_KEEP_ALIVE: Duration = Duration::from_secs(6);

/// etcd's errors as the store's: transport trouble and timeouts are `Unavailable`
/// (a connection the server closed with a GOAWAY too: gRPC reports ENHANCE_YOUR_CALM
/// as `ResourceExhausted`), a lease etcd does not know is `LeaseExpired`, refusals
/// of its authentication `Auth`, the rest `Refused`.
fn map_err(e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(s) if auth_refusal(s.code(), s.message()) => StoreError::Auth(explain_auth(s.message())),
        E::GRpcStatus(s) => match s.code() {
            tonic_code::Unavailable | tonic_code::DeadlineExceeded | tonic_code::Cancelled | tonic_code::Unknown => {
                StoreError::Unavailable(s.message().to_string())
            }
            tonic_code::ResourceExhausted if s.message().contains("h2 protocol error") => {
                StoreError::Unavailable(s.message().to_string())
            }
            tonic_code::NotFound if s.message().contains("lease") => StoreError::LeaseExpired(0),
            _ => StoreError::Refused(format!("{}: {}", code_name(s.code()), s.message())),
        },
        E::TransportError(t) => StoreError::Unavailable(t.to_string()),
        E::IoError(io) => StoreError::Unavailable(io.to_string()),
        E::LeaseKeepAliveError(m) if m.contains("not found") => StoreError::LeaseExpired(0),
        other => StoreError::Unavailable(other.to_string()),
    }
}

use tonic::Code as tonic_code;

/// Whether etcd refused a call for its authentication: no credentials where auth
/// is on (`user name is empty`), wrong ones, a token it does not know, no
/// permission on the key, or credentials where auth is off.
fn auth_refusal(code: tonic_code, message: &str) -> bool {
    matches!(code, tonic_code::Unauthenticated | tonic_code::PermissionDenied)
        || ["user name is empty", "authentication failed", "authentication is not enabled", INVALID_TOKEN]
            .iter()
            .any(|m| message.contains(m))
}

/// etcd's message, with what to do about it where sluice knows.
fn explain_auth(message: &str) -> String {
    if message.contains("user name is empty") {
        format!("{message}: etcd has authentication on and no credentials were given (set {ENV_USER} and {ENV_PASSWORD_FILE})")
    } else if message.contains("authentication failed") {
        format!("{message} (the user in {ENV_USER}, the password in {ENV_PASSWORD_FILE} or {ENV_PASSWORD})")
    } else if message.contains("permission denied") {
        format!("{message}: the user's role does not grant read and write on the keys' prefix (--etcd-prefix)")
    } else if message.contains("authentication is not enabled") {
        format!("{message}: credentials were given to an etcd without authentication (etcdctl auth enable, or unset {ENV_USER})")
    } else {
        message.to_string()
    }
}

fn code_name(c: tonic_code) -> String {
    format!("{c:?}")
}

/// A unary call under [`OP_TIMEOUT`].
async fn bounded<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(StoreError::Unavailable(format!("{what}: no answer within {} s", OP_TIMEOUT.as_secs()))),
    }
}

fn to_kv(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    }
}

fn compare(c: &Compare) -> EtcdCompare {
    match c {
        Compare::Absent(k) => EtcdCompare::create_revision(k.as_str(), CompareOp::Equal, 0),
        Compare::Value(k, v) => EtcdCompare::value(k.as_str(), CompareOp::Equal, v.clone()),
        Compare::ModRevision(k, r) => EtcdCompare::mod_revision(k.as_str(), CompareOp::Equal, *r),
    }
}

fn op(o: &Op) -> TxnOp {
    match o {
        Op::Put { key, value, lease } => {
            TxnOp::put(key.as_str(), value.clone(), lease.map(|l| PutOptions::new().with_lease(l)))
        }
        Op::Delete(k) => TxnOp::delete(k.as_str(), None),
    }
}

impl Store for EtcdStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyValue>, StoreError>> {
        Box::pin(async move {
            let r = self.call("get", |mut c| async move { c.get(key, None).await }).await?;
            Ok(r.kvs().first().map(to_kv))
        })
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(async move {
            let put = |mut c: Client| {
                let value = value.clone();
                async move { c.put(key, value, lease.map(|l| PutOptions::new().with_lease(l))).await }
            };
            let r = self.call("put", put).await.map_err(|e| match (e, lease) {
                (StoreError::LeaseExpired(_), Some(l)) => StoreError::LeaseExpired(l),
                (e, _) => e,
            })?;
            Ok(r.header().map_or(0, |h| h.revision()))
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(async move {
            let r = self.call("delete", |mut c| async move { c.delete(key, None).await }).await?;
            Ok(r.header().map_or(0, |h| h.revision()))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>> {
        Box::pin(async move {
            let r = self
                .call("list", |mut c| async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await })
                .await?;
            Ok(Listing { kvs: r.kvs().iter().map(to_kv).collect(), revision: r.header().map_or(0, |h| h.revision()) })
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, StoreError>> {
        Box::pin(async move {
            let t = EtcdTxn::new()
                .when(txn.when.iter().map(compare).collect::<Vec<_>>())
                .and_then(txn.then.iter().map(op).collect::<Vec<_>>())
                .or_else(txn.otherwise.iter().map(op).collect::<Vec<_>>());
            let r = self
                .call("txn", |mut c| {
                    let t = t.clone();
                    async move { c.txn(t).await }
                })
                .await?;
            Ok(TxnOutcome { succeeded: r.succeeded(), revision: r.header().map_or(0, |h| h.revision()) })
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str, from_revision: i64) -> BoxFuture<'a, Result<Watch, StoreError>> {
        Box::pin(async move {
            let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
            let (cancel, cancelled) = tokio::sync::oneshot::channel();
            // Open the first stream here, so a caller learns at once that the store is
            // down or the revision compacted.
            let mut c = self.client.clone();
            let first = match open(&mut c, prefix, from_revision).await {
                Err(StoreError::Auth(m)) if self.authenticated && m.contains(INVALID_TOKEN) => {
                    self.reauthenticate().await?;
                    open(&mut c, prefix, from_revision).await?
                }
                r => r?,
            };
            tokio::spawn(pump(self.clone(), prefix.to_string(), from_revision, first, tx, cancelled));
            Ok(Watch { rx, _cancel: Some(cancel) })
        })
    }

    fn grant(&self, ttl_s: i64) -> BoxFuture<'_, Result<LeaseId, StoreError>> {
        Box::pin(async move {
            let r = self.call("lease grant", |mut c| async move { c.lease_grant(ttl_s, None).await }).await?;
            if !r.error().is_empty() {
                return Err(StoreError::Refused(format!("lease grant: {}", r.error())));
            }
            Ok(r.id())
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            // etcd-client sends the first keep-alive and reads its answer when it opens
            // the stream, and says "lease not found" when the TTL came back as 0.
            self.call("lease keep-alive", |mut c| async move { c.lease_keep_alive(lease).await }).await.map_err(
                |e| match e {
                    StoreError::LeaseExpired(_) => StoreError::LeaseExpired(lease),
                    e => e,
                },
            )?;
            Ok(())
        })
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            match self.call("lease revoke", |mut c| async move { c.lease_revoke(lease).await }).await {
                Ok(_) | Err(StoreError::LeaseExpired(_)) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn compact(&self, revision: i64) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.call("compact", |mut c| async move { c.compact(revision, None).await }).await?;
            Ok(())
        })
    }
}

/// Opens a watch stream on `prefix` from `from` (0: now), and reads its "created"
/// answer: a compacted revision is refused there.
async fn open(c: &mut Client, prefix: &str, from: i64) -> Result<(etcd_client::WatchStream, i64), StoreError> {
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream = bounded("watch", c.watch(prefix, Some(options))).await?;
    // The first answer confirms the watch (or cancels it at once, compacted).
    let first = tokio::time::timeout(OP_TIMEOUT, stream.message())
        .await
        .map_err(|_| StoreError::Unavailable("watch: not confirmed in time".into()))?
        .map_err(map_err)?
        .ok_or_else(|| StoreError::Unavailable("watch: the stream closed at once".into()))?;
    if first.compact_revision() > 0 {
        return Err(StoreError::Compacted { requested: from, compacted: first.compact_revision() });
    }
    if first.canceled() {
        return Err(StoreError::Refused(format!("watch cancelled: {}", first.cancel_reason())));
    }
    // Watching "from now", the first event to expect is after the created header's revision.
    let next = if from > 0 { from } else { first.header().map_or(0, |h| h.revision()) + 1 };
    // A created answer may already carry events; they are read by the pump's loop,
    // since etcd sends them in later messages (created answers carry none).
    Ok((stream, next))
}

/// Passes a watch's events on, re-opening the stream from the next revision when
/// it breaks (see the module docs); ends on cancellation, compaction, or a store
/// that stays unreachable for [`WATCH_RETRY_FOR`].
async fn pump(
    store: EtcdStore,
    prefix: String,
    _from: i64,
    first: (etcd_client::WatchStream, i64),
    tx: tokio::sync::mpsc::Sender<Result<Event, StoreError>>,
    mut cancelled: tokio::sync::oneshot::Receiver<()>,
) {
    let (mut stream, mut next) = first;
    loop {
        // Read until the stream breaks.
        loop {
            let msg = tokio::select! {
                _ = &mut cancelled => return,
                m = stream.message() => m,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => break,
            };
            if resp.compact_revision() > 0 {
                let _ =
                    tx.send(Err(StoreError::Compacted { requested: next, compacted: resp.compact_revision() })).await;
                return;
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let kind = match ev.event_type() {
                    EventType::Put => EventKind::Put,
                    EventType::Delete => EventKind::Delete,
                };
                let kv = to_kv(kv);
                next = kv.mod_revision + 1;
                if tx.send(Ok(Event { kind, kv })).await.is_err() {
                    return;
                }
            }
            if resp.canceled() {
                // A member losing its leader cancels its watches (require_leader):
                // re-open on another.
                break;
            }
        }
        // Re-open from the revision after the last event passed on.
        let started = tokio::time::Instant::now();
        stream = loop {
            if tx.is_closed() {
                return;
            }
            let mut c = store.client.clone();
            match open(&mut c, &prefix, next).await {
                Ok((s, _)) => break s,
                Err(e @ StoreError::Compacted { .. }) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                // The member it re-opens on restarted and forgot the token: get
                // another, then try again at once.
                Err(StoreError::Auth(m)) if store.authenticated && m.contains(INVALID_TOKEN) => {
                    if let Err(e) = store.reauthenticate().await {
                        tracing::debug!(%prefix, "watch: authenticating again: {e}");
                    }
                }
                Err(e) if started.elapsed() >= WATCH_RETRY_FOR => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                Err(e) => {
                    tracing::debug!(%prefix, next, "watch: re-opening: {e}");
                    tokio::select! {
                        _ = &mut cancelled => return,
                        _ = tokio::time::sleep(WATCH_RETRY_PAUSE) => {}
                    }
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_errors_name_the_variable() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let e = EtcdCredentials::from_vars(vars(&[(ENV_USER, "sluice")])).unwrap_err();
        assert!(matches!(&e, CredentialsError::NoPassword { user } if user == "sluice"), "{e:?}");
        assert_eq!(
            e.to_string(),
            "SLUICE_ETCD_USER=sluice without a password: set SLUICE_ETCD_PASSWORD_FILE (or SLUICE_ETCD_PASSWORD)"
        );
        let e = EtcdCredentials::from_vars(vars(&[(ENV_PASSWORD, "x")])).unwrap_err();
        assert_eq!(e.to_string(), "an etcd password without a user: set SLUICE_ETCD_USER");
        let e =
            EtcdCredentials::from_vars(vars(&[(ENV_USER, "u"), (ENV_PASSWORD_FILE, "/no/such/password")])).unwrap_err();
        assert!(e.to_string().starts_with("SLUICE_ETCD_PASSWORD_FILE=/no/such/password: "), "{e}");
        let ok = EtcdCredentials::from_vars(vars(&[(ENV_USER, "u"), (ENV_PASSWORD, "p")])).unwrap();
        assert_eq!(ok, Some(EtcdCredentials { user: "u".into(), password: "p".into() }));
        assert_eq!(EtcdCredentials::from_vars(vars(&[])).unwrap(), None);
    }
}
