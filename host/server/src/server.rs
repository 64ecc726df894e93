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

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::conn::{share_of, Activity, ConnectionPermit, Connections, Socket};
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
    let accept_errors = crate::throttle::RateLimitedLog::default();
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
    slot: ConnectionPermit,
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
    let io = TokioIo::new(Socket::bytes(stream, activity.clone()));
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
