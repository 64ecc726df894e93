//! Connections as the fronts hold them: the table of slots every front shares, with
//! each client's share of them ([`Connections`]), a connection's activity
//! ([`Activity`]), and the one socket wrapper both fronts serve through
//! ([`Socket`]), with the two rules of idleness ([`Idleness`]): for HTTP/1 no byte
//! moved (its front closes the idle), for gRPC no call in progress (HTTP/2's
//! keep-alive pings move bytes; the socket itself ends). A leaf below the fronts
//! ([`crate::server`], [`crate::grpc`]): it knows the config and the metrics only.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tonic::transport::server::Connected;

use crate::metrics::Metrics;

/// The connections a client keeps once every slot is taken, when the config does
/// not say (`connection_share`): a quarter of the cap (so one client alone may
/// still hold most of an idle server, and four heavy ones can share it), at least
/// [`SHARE_FLOOR`].
pub(crate) fn share_of(config: &crate::config::Config, max_connections: usize) -> usize {
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
pub(crate) struct ConnectionPermit {
    connections: Arc<Connections>,
    client: IpAddr,
    id: u64,
    /// Set when another client needs the slot.
    pub(crate) close: Arc<CloseSignal>,
}

impl Drop for ConnectionPermit {
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
    ) -> Option<ConnectionPermit> {
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
        Some(ConnectionPermit { connections: self.clone(), client, id, close })
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

/// A connection's socket as a front serves it: the stream, its [`Activity`], and
/// its rule of idleness. One type for both fronts, so that what moving a byte or
/// ending a connection means is written once.
pub(crate) struct Socket {
    inner: TcpStream,
    activity: Arc<Activity>,
    idleness: Idleness,
}

/// When a connection is idle, and who ends it then.
pub(crate) enum Idleness {
    /// HTTP/1: every byte moved either way is activity, and the front closes a
    /// connection idle too long or asked for its slot (`crate::server::serve`,
    /// which holds the slot and counts the connection).
    Bytes,
    /// HTTP/2 (gRPC): activity is calls only (the keep-alive pings move bytes),
    /// and the socket ends itself ([`Ending`]).
    Calls(Box<Ending>),
}

/// How a gRPC connection ends: it holds its slot and counts as open until dropped,
/// and ends (its reads see the end of the stream, so hyper closes it) once no call
/// has been in progress on it for `idle_timeout_ms`. hyper has no idle timeout for
/// HTTP/2, and the keep-alive pings move bytes, so idleness is judged by calls, as
/// grpc-go's `MaxConnectionIdle` does.
pub(crate) struct Ending {
    /// Its place in the connection table, given back when dropped.
    _slot: ConnectionPermit,
    /// Resolves when the table asks for the slot back (another client needs it).
    asked: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Set once asked: it ends as soon as no call is in progress.
    giving_up: bool,
    metrics: Arc<Metrics>,
    idle: std::time::Duration,
    /// Set once it was found idle: its reads stay at the end of the stream.
    ended: bool,
    /// Wakes the connection's reader to look at `activity` again.
    timer: Pin<Box<tokio::time::Sleep>>,
}

/// What tonic puts in each call's extensions for this connection.
#[derive(Clone)]
pub(crate) struct ConnInfo {
    /// The connection's calls in progress and last activity.
    pub(crate) activity: Arc<Activity>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.metrics.connections.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connected for Socket {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo { activity: self.activity.clone() }
    }
}

impl Socket {
    /// An HTTP/1 connection's socket: idle when no byte moves ([`Idleness::Bytes`]).
    pub(crate) fn bytes(inner: TcpStream, activity: Arc<Activity>) -> Socket {
        Socket { inner, activity, idleness: Idleness::Bytes }
    }

    /// A gRPC connection admitted to `slot`, ending once no call was in progress on
    /// it for `idle` (or once its slot is asked back and no call is in progress).
    pub(crate) fn calls(
        inner: TcpStream,
        slot: ConnectionPermit,
        metrics: Arc<Metrics>,
        activity: Arc<Activity>,
        idle: Duration,
    ) -> Socket {
        let close = slot.close.clone();
        let ending = Ending {
            _slot: slot,
            asked: Box::pin(async move { close.asked().await }),
            giving_up: false,
            metrics,
            idle,
            ended: false,
            timer: Box::pin(tokio::time::sleep(idle)),
        };
        Socket { inner, activity, idleness: Idleness::Calls(Box::new(ending)) }
    }

    /// Bytes moved: activity, where bytes count.
    fn moved(&self, n: usize) {
        if n > 0 && matches!(self.idleness, Idleness::Bytes) {
            self.activity.touch();
        }
    }
}

impl Ending {
    /// With nothing to read: whether the connection ends now (idle, or giving its
    /// slot up between calls); else the timer is set to look again when it could
    /// first be, and Pending.
    fn poll_end(&mut self, activity: &Activity, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if !self.giving_up && self.asked.as_mut().poll(cx).is_ready() {
                self.giving_up = true;
            }
            // Asked for its slot (counted by the table): it ends between calls.
            if self.giving_up && !activity.busy() {
                self.ended = true;
                return Poll::Ready(());
            }
            if activity.idle(self.idle) {
                self.ended = true;
                self.metrics.connections.idle_closed.fetch_add(1, Ordering::Relaxed);
                return Poll::Ready(());
            }
            // A call in progress touches the activity when it ends; until then
            // look again a whole period later (soon, when giving the slot up).
            let left = if self.giving_up {
                std::time::Duration::from_millis(10)
            } else if activity.busy() {
                self.idle
            } else {
                self.idle.saturating_sub(activity.idle_for())
            };
            let left = left.max(std::time::Duration::from_millis(10));
            let at = tokio::time::Instant::now() + left;
            // A pending read comes once per call or more: the timer is re-armed only
            // when it has fired or must fire sooner. One set later than needed would
            // find the connection idle late; one set sooner only looks again early.
            if self.timer.is_elapsed() || at < self.timer.deadline() {
                self.timer.as_mut().reset(at);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if let Idleness::Calls(ending) = &this.idleness {
            if ending.ended {
                return Poll::Ready(Ok(()));
            }
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if read.is_ready() {
            this.moved(buf.filled().len() - before);
            return read;
        }
        // Nothing to read: a gRPC connection ends here if it is idle or gives its
        // slot up.
        match &mut this.idleness {
            Idleness::Bytes => Poll::Pending,
            Idleness::Calls(ending) => ending.poll_end(&this.activity, cx).map(Ok),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.moved(n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.moved(n);
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
    fn open(c: &Arc<Connections>, m: &Metrics, from: &str, n: usize) -> Vec<(ConnectionPermit, Arc<Activity>)> {
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
