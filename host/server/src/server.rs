//! Running the HTTP server (and the gRPC one beside it, [`crate::grpc`]) until
//! shutdown, then draining.
//!
//! Start here: [`crate::state::State::build`] then [`run`], which mirrors mini-redis's
//! `server::run(listener, shutdown)`: tests bind `127.0.0.1:0` and pass their own
//! shutdown future.
//!
//! Connections are held to what a production front needs against slow, idle and
//! too many clients (config keys in [`crate::config::Config`]):
//! - a request's head must arrive within `header_read_timeout_ms` (hyper's timer;
//!   a slowloris sending one header byte at a time is cut off);
//! - a connection with no request in progress that moves no byte for
//!   `idle_timeout_ms` is closed (idle keep-alive sockets, clients that stop
//!   reading their response);
//! - a body must arrive within `body_read_timeout_ms` ([`crate::api::read_body`]);
//! - at most `max_connections` are open; one more is answered with a 503 naming the
//!   limit and closed, so the process never runs out of descriptors;
//! - no client takes every slot ([`Connections`]): once they are all open, a client
//!   under its share (`connection_share`) takes the slot of an idle connection of
//!   the client holding the most;
//! - failed accepts are logged at most once a second, with how many were not.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::state::State;

/// Refusals of connections over the limit in progress at once; beyond them a
/// connection is closed without an answer (each refusal holds a descriptor for up
/// to [`REFUSAL_TIME`]).
const MAX_REFUSALS: usize = 64;

/// How long a refusal may take: writing the 503 and reading what the client sent.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// Serves HTTP on `listener` until `shutdown` resolves, then drains gracefully.
pub async fn run(listener: TcpListener, state: Arc<State>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    run_with_admin(listener, None, state, shutdown).await
}

/// As [`run`], with the admin API on a listener of its own (`admin_listen`): it
/// serves only `/admin`, `/dashboard` and `/metrics`, and `listener` no longer
/// serves `/admin` or `/dashboard`.
/// Both count against `max_connections`.
pub async fn run_with_admin(
    listener: TcpListener,
    admin: Option<TcpListener>,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    run_listeners(Listeners { main: listener, admin, grpc: None }, state, shutdown).await
}

/// The listeners a server serves.
pub struct Listeners {
    /// HTTP: the Open Inference Protocol, `/infer`, `/metrics`, and `/admin` unless
    /// `admin` is given.
    pub main: TcpListener,
    /// `/admin`, `/dashboard` and `/metrics` only (`admin_listen`).
    pub admin: Option<TcpListener>,
    /// The KServe v2 gRPC protocol (`grpc_listen`, [`crate::grpc`]).
    pub grpc: Option<TcpListener>,
}

/// As [`run_with_admin`], with gRPC beside HTTP when `listeners.grpc` is given. All
/// listeners share `max_connections` (and each client's share of them); at shutdown
/// gRPC stops taking calls with HTTP, the queues drain (answering the calls in
/// progress), then both close.
pub async fn run_listeners(
    listeners: Listeners,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let Listeners { main: listener, admin, grpc } = listeners;
    tokio::pin!(shutdown);
    let limits = Limits::of(&state.config);
    let slots = Connections::new(limits.max_connections, share_of(&state.config, limits.max_connections));
    let grpc = grpc.map(|l| {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(crate::grpc::serve(l, state.clone(), slots.clone(), async move {
            let _ = stopped.await;
        }));
        (stop, task)
    });
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let accept_errors = crate::api::RateLimitedLog::default();
    let mut connections = JoinSet::new();
    let (close_tx, close_rx) = tokio::sync::watch::channel(false);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            // Reap finished connections so the set does not grow with every one served.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = accept(&listener, admin.as_ref()) => {
                let (accepted, via_admin) = accepted;
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: keep serving the others,
                        // without filling the log.
                        accept_errors.warn(|suppressed| tracing::warn!("accept failed: {e} ({suppressed} more not logged)"));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let activity = Activity::start();
                let Some(slot) = slots.admit(peer.ip(), &activity, &state.metrics) else {
                    state.metrics.connections.refused.fetch_add(1, Ordering::Relaxed);
                    if let Ok(r) = refusals.clone().try_acquire_owned() {
                        tokio::spawn(refuse(stream, limits.max_connections, r));
                    }
                    continue;
                };
                let conn = Conn { peer, via_admin, slot, activity };
                connections.spawn(serve(stream, conn, state.clone(), close_rx.clone(), limits));
            }
        }
    }
    drop(listener);
    drop(admin);
    tracing::info!("shutting down: not accepting new requests, draining queues");
    // gRPC stops taking calls now and finishes those in progress as the queues drain.
    let grpc = grpc.map(|(stop, task)| {
        let _ = stop.send(());
        task
    });
    state.drain(Duration::from_millis(state.config.shutdown_grace_ms)).await;
    let _ = close_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while connections.join_next().await.is_some() {}
        if let Some(task) = grpc {
            match task.await {
                Ok(Err(e)) => tracing::warn!("{e}"),
                Err(e) => tracing::warn!("gRPC server task: {e}"),
                Ok(Ok(())) => {}
            }
        }
    })
    .await;
    Ok(())
}

/// The next connection on either listener, and whether it came on the admin one.
async fn accept(
    main: &TcpListener,
    admin: Option<&TcpListener>,
) -> (std::io::Result<(TcpStream, std::net::SocketAddr)>, bool) {
    match admin {
        None => (main.accept().await, false),
        Some(admin) => tokio::select! {
            a = main.accept() => (a, false),
            a = admin.accept() => (a, true),
        },
    }
}

/// The connection limits of the config.
#[derive(Clone, Copy, Debug)]
struct Limits {
    header_read: Duration,
    idle: Duration,
    max_connections: usize,
}

impl Limits {
    fn of(config: &crate::config::Config) -> Limits {
        let mut max_connections = config.max_connections;
        if let Some(room) = descriptor_limit().map(|l| l.saturating_sub(DESCRIPTOR_RESERVE) as usize) {
            if max_connections > room {
                tracing::warn!(
                    "max_connections = {max_connections} does not fit the descriptor limit (ulimit -n) less \
                     {DESCRIPTOR_RESERVE} for models, policies and logs: serving at most {room} connections"
                );
                max_connections = room.max(1);
            }
        }
        Limits {
            header_read: Duration::from_millis(config.header_read_timeout_ms),
            idle: Duration::from_millis(config.idle_timeout_ms),
            max_connections,
        }
    }
}

/// Descriptors kept for everything but connections (model files, the policy cache,
/// logs, refusals in progress).
const DESCRIPTOR_RESERVE: u64 = 256;

/// The process's soft limit on open descriptors, from `/proc/self/limits` (None
/// where that file does not exist or says "unlimited").
fn descriptor_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// An admitted HTTP connection: who it is from, and what it holds.
struct Conn {
    peer: std::net::SocketAddr,
    /// Whether it came in on the admin listener.
    via_admin: bool,
    /// Its place in [`Connections`].
    slot: Slot,
    activity: Arc<Activity>,
}

/// Serves one connection until it ends, is idle too long, is asked to give its slot
/// up, or the server closes.
async fn serve(
    stream: TcpStream,
    conn: Conn,
    state: Arc<State>,
    mut close: tokio::sync::watch::Receiver<bool>,
    limits: Limits,
) {
    let Conn { peer, via_admin, slot, activity } = conn;
    let metrics = state.metrics.clone();
    metrics.connections.open.fetch_add(1, Ordering::Relaxed);
    let io = TokioIo::new(Tracked { inner: stream, activity: activity.clone() });
    let busy = activity.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(crate::api::Peer(peer));
        if via_admin {
            req.extensions_mut().insert(crate::api::AdminListener);
        }
        let state = state.clone();
        let guard = busy.begin();
        async move {
            let response = crate::http::handle(state.clone(), req).await;
            state.metrics.response("http", response.status().as_str());
            drop(guard);
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval((limits.idle / 4).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut giving_up = false;
    loop {
        tokio::select! {
            // Another client needs the slot ([`Connections`]): an idle connection
            // closes now, one with a request in progress after answering it
            // (hyper's graceful shutdown turns keep-alive off).
            _ = slot.close.asked(), if !giving_up => {
                giving_up = true;
                conn.as_mut().graceful_shutdown();
            }
            r = conn.as_mut() => {
                if let Err(e) = r {
                    if e.is_timeout() {
                        metrics.connections.header_timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!("connection: {e}");
                }
                break;
            }
            _ = close.changed() => {
                // Finish the in-flight request, then close the connection.
                conn.as_mut().graceful_shutdown();
                let _ = conn.as_mut().await;
                break;
            }
            _ = tick.tick() => {
                if activity.idle(limits.idle) {
                    // Nothing to finish: dropping the connection closes the socket.
                    metrics.connections.idle_closed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
    metrics.connections.open.fetch_sub(1, Ordering::Relaxed);
    drop(slot);
}

/// Answers a connection over the limit with a 503 naming it, then reads what the
/// client sent (so it sees the answer, not a reset) and closes, within
/// [`REFUSAL_TIME`].
async fn refuse(mut stream: TcpStream, limit: usize, _permit: OwnedSemaphorePermit) {
    let body = format!("{{\"error\":\"connection limit of {limit} reached; retry later\"}}");
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// The connections a client keeps once every slot is taken, when the config does
/// not say (`connection_share`): a quarter of the cap (so one client alone may
/// still hold most of an idle server, and four heavy ones can share it), at least
/// [`SHARE_FLOOR`].
fn share_of(config: &crate::config::Config, max_connections: usize) -> usize {
    config.connection_share.unwrap_or((max_connections / 4).max(SHARE_FLOOR))
}

/// The least default share: a client's connection pool (browsers open 6 per host,
/// HTTP client pools about as many) is not cut below it on a small cap.
const SHARE_FLOOR: usize = 8;

/// Whom a connection counts against: its IPv4 address, or the /64 of its IPv6 one
/// (an IPv4-mapped address as IPv4). A host or a subscriber line is given a whole
/// /64, so counting its addresses one by one would give one client 2^64 shares.
pub(crate) fn client_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// The open connections of every front (HTTP, the admin listener and gRPC share
/// them), by client ([`client_of`]): at most `cap`, and none of them any client's
/// for good.
///
/// Below the cap every connection is admitted: a client alone (or every client
/// behind one proxy) may use the whole server. At the cap, a connection from a
/// client holding fewer than `share` connections is admitted in place of one of the
/// client holding the most, when that one holds more than `share`: its connection
/// idle longest (no request in progress) is asked to close, and the slot changes
/// hands at once. When every connection of that client has a request in progress,
/// its oldest is asked to close after answering and the newcomer is refused (503,
/// `retry-after: 1`): the cap stays a hard bound on descriptors, and the slot freed
/// is there for the retry. Any other connection at the cap is refused, as before.
/// So a client re-opening idle sockets as fast as they close keeps nobody out (one
/// held every slot and kept 36 of 40 other clients at 503 for 40 s), and clients
/// that each hold at most `share` are never disturbed. Many addresses acting
/// together (a botnet) are beyond what per-address fairness can tell apart; the
/// cap still bounds what they cost.
///
/// A mutex over a small map: taken once per accepted and once per closed
/// connection, never across an await; only at the cap does choosing whom to ask
/// scan the clients.
pub(crate) struct Connections {
    cap: usize,
    share: usize,
    table: parking_lot::Mutex<Table>,
}

#[derive(Default)]
struct Table {
    /// Connections counted against the cap.
    open: usize,
    next_id: u64,
    by_client: HashMap<IpAddr, Vec<Held>>,
}

/// A connection as the table knows it.
struct Held {
    id: u64,
    activity: Arc<Activity>,
    close: Arc<CloseSignal>,
}

/// How the table asks a connection to give its slot up.
#[derive(Default)]
pub(crate) struct CloseSignal {
    asked: std::sync::atomic::AtomicBool,
    notify: Notify,
}

impl CloseSignal {
    fn ask(&self) {
        self.asked.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Whether the connection was asked to close.
    pub(crate) fn is_asked(&self) -> bool {
        self.asked.load(Ordering::Acquire)
    }

    /// Resolves once the connection is asked to close.
    pub(crate) async fn asked(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_asked() {
                return;
            }
            notified.await;
        }
    }
}

/// A connection's place in [`Connections`], given back when dropped.
pub(crate) struct Slot {
    connections: Arc<Connections>,
    client: IpAddr,
    id: u64,
    /// Set when another client needs the slot.
    pub(crate) close: Arc<CloseSignal>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self.connections.table.lock();
        let Some(held) = t.by_client.get_mut(&self.client) else { return };
        // Absent when its slot already changed hands ([`Connections::make_room`]).
        let Some(i) = held.iter().position(|h| h.id == self.id) else { return };
        held.swap_remove(i);
        if held.is_empty() {
            t.by_client.remove(&self.client);
        }
        t.open -= 1;
    }
}

impl Connections {
    /// A table of `cap` slots in which a client keeps `share` (0: no fairness, the
    /// cap alone).
    pub(crate) fn new(cap: usize, share: usize) -> Arc<Connections> {
        Arc::new(Connections { cap, share, table: parking_lot::Mutex::new(Table::default()) })
    }

    /// A slot for a connection from `peer` whose requests `activity` tracks, or
    /// None when it must be refused (see the type's doc).
    pub(crate) fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        activity: &Arc<Activity>,
        metrics: &crate::metrics::Metrics,
    ) -> Option<Slot> {
        let client = client_of(peer);
        let mut t = self.table.lock();
        if t.open >= self.cap && !self.make_room(&mut t, client, metrics) {
            return None;
        }
        t.open += 1;
        t.next_id += 1;
        let id = t.next_id;
        let close = Arc::new(CloseSignal::default());
        t.by_client.entry(client).or_default().push(Held { id, activity: activity.clone(), close: close.clone() });
        Some(Slot { connections: self.clone(), client, id, close })
    }

    /// At the cap: frees a slot for `client` from the client holding the most, if
    /// `client` holds fewer than its share and that one more. True when a slot was
    /// freed.
    fn make_room(&self, t: &mut Table, client: IpAddr, metrics: &crate::metrics::Metrics) -> bool {
        let mine = t.by_client.get(&client).map_or(0, Vec::len);
        if mine >= self.share {
            return false;
        }
        let Some((heaviest, most)) = t.by_client.iter().map(|(c, h)| (*c, h.len())).max_by_key(|(_, n)| *n) else {
            return false;
        };
        if most <= self.share {
            return false;
        }
        let Some(held) = t.by_client.get_mut(&heaviest) else { return false };
        let idle = held
            .iter()
            .enumerate()
            .filter(|(_, h)| !h.activity.busy())
            .max_by_key(|(_, h)| h.activity.idle_for())
            .map(|(i, _)| i);
        let evicted = &metrics.connections.evicted;
        match idle {
            Some(i) => {
                let h = held.swap_remove(i);
                t.open -= 1;
                h.close.ask();
                evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => {
                // Every one is answering a request: the oldest not yet asked closes
                // after its answer, and its slot is free for the newcomer's retry.
                if let Some(h) = held.iter().filter(|h| !h.close.is_asked()).min_by_key(|h| h.id) {
                    h.close.ask();
                    evicted.fetch_add(1, Ordering::Relaxed);
                }
                false
            }
        }
    }
}

/// When a connection last moved a byte, and how many of its requests are in
/// progress (a request waiting for its batch moves no byte and is not idle). The
/// gRPC front ([`crate::grpc`]) uses it too, touched only as calls begin and end.
#[derive(Default)]
pub(crate) struct Activity {
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

/// The process's reference instant for [`Activity`] (milliseconds fit an atomic).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Activity {
    /// A new connection's, active now.
    pub(crate) fn start() -> Arc<Self> {
        let activity = Arc::new(Activity::default());
        activity.touch();
        activity
    }

    fn touch(&self) {
        self.last_ms.store(epoch().elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Time since the last activity.
    pub(crate) fn idle_for(&self) -> Duration {
        Duration::from_millis(
            (epoch().elapsed().as_millis() as u64).saturating_sub(self.last_ms.load(Ordering::Relaxed)),
        )
    }

    /// Whether a request is in progress.
    pub(crate) fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Whether no request is in progress and there was no activity for `limit`.
    pub(crate) fn idle(&self, limit: Duration) -> bool {
        !self.busy() && self.idle_for() >= limit
    }

    /// A request begins: it is in progress until the guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }
}

/// A request in progress on a connection.
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A socket that records when it last moved a byte.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// `n` connections from `from`, each idle (no request in progress).
    fn open(c: &Arc<Connections>, m: &Metrics, from: &str, n: usize) -> Vec<(Slot, Arc<Activity>)> {
        (0..n)
            .map(|_| {
                let a = Activity::start();
                (c.admit(ip(from), &a, m).expect("admitted"), a)
            })
            .collect()
    }

    #[test]
    fn below_the_cap_anyone_may_take_every_slot() {
        let (c, m) = (Connections::new(4, 1), Metrics::default());
        let held = open(&c, &m, "10.0.0.1", 4);
        assert!(held.iter().all(|(s, _)| !s.close.is_asked()));
        // At the cap, the holder itself is refused: it is over its share.
        assert!(c.admit(ip("10.0.0.1"), &Activity::start(), &m).is_none());
    }

    #[test]
    fn at_the_cap_a_client_under_its_share_takes_an_idle_slot_of_the_heaviest() {
        let (c, m) = (Connections::new(4, 1), Metrics::default());
        let heavy = open(&c, &m, "10.0.0.1", 4);
        let newcomer = c.admit(ip("10.0.0.2"), &Activity::start(), &m).expect("a client under its share gets in");
        assert_eq!(heavy.iter().filter(|(s, _)| s.close.is_asked()).count(), 1, "one idle connection gives way");
        assert_eq!(m.connections.evicted.load(Ordering::Relaxed), 1);
        // The newcomer is at its share now: its second connection is refused.
        assert!(c.admit(ip("10.0.0.2"), &Activity::start(), &m).is_none());
        // The slot of the asked connection changed hands: dropping it frees nothing.
        let asked = heavy.into_iter().find(|(s, _)| s.close.is_asked()).unwrap();
        drop(asked);
        assert!(c.admit(ip("10.0.0.3"), &Activity::start(), &m).is_some(), "the heavy client still holds 3 > 1");
        drop(newcomer);
    }

    #[test]
    fn a_busy_heaviest_closes_after_its_request_and_the_newcomer_retries() {
        let (c, m) = (Connections::new(2, 1), Metrics::default());
        let heavy = open(&c, &m, "10.0.0.1", 2);
        let _requests: Vec<InFlight> = heavy.iter().map(|(_, a)| a.begin()).collect();
        assert!(c.admit(ip("10.0.0.2"), &Activity::start(), &m).is_none(), "the cap holds");
        let asked: Vec<bool> = heavy.iter().map(|(s, _)| s.close.is_asked()).collect();
        assert_eq!(asked, [true, false], "the oldest is asked to close after its answer");
        let mut heavy = heavy;
        drop(heavy.remove(0));
        assert!(c.admit(ip("10.0.0.2"), &Activity::start(), &m).is_some(), "its slot is free for the retry");
    }

    #[test]
    fn clients_within_their_share_are_never_disturbed() {
        let (c, m) = (Connections::new(4, 2), Metrics::default());
        let a = open(&c, &m, "10.0.0.1", 2);
        let b = open(&c, &m, "10.0.0.2", 2);
        assert!(c.admit(ip("10.0.0.3"), &Activity::start(), &m).is_none());
        assert!(a.iter().chain(&b).all(|(s, _)| !s.close.is_asked()));
        // A share of 0 turns the fairness off.
        let (c, m) = (Connections::new(1, 0), Metrics::default());
        let _one = open(&c, &m, "10.0.0.1", 1);
        assert!(c.admit(ip("10.0.0.2"), &Activity::start(), &m).is_none());
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64() {
        assert_eq!(client_of(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(client_of(ip("2001:db8:1:2:bbbb::7")), client_of(ip("2001:db8:1:2:aaaa::1")));
        assert_ne!(client_of(ip("2001:db8:1:3::1")), client_of(ip("2001:db8:1:2::1")));
        assert_eq!(client_of(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(client_of(ip("10.0.0.1")), ip("10.0.0.1"));
    }
}
