//! What the HTTP front and the admin API share at the edge: the response body type,
//! the one error type [`ApiError`] (a status and an `{"error": "..."}` body; client
//! errors echo what was wrong, server errors log the cause and say nothing more),
//! and the helpers that read bodies and find apps.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::App;
use crate::state::State;
use sluice_core::registry::RegistryError;

/// The response body type.
pub type Body = Full<Bytes>;

/// An error answered to the client.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// The message in `{"error": ...}`.
    pub message: String,
    /// Extra fields merged into the body.
    pub extra: Option<Value>,
    /// The `Allow` header of a 405: the method the route takes.
    pub allow: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), extra: None, allow: None }
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
    /// A server-side failure: the cause is logged, the client gets a generic message.
    pub(crate) fn internal(cause: impl std::fmt::Display) -> ApiError {
        tracing::error!("internal error: {cause}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal server error (see the server log)")
    }

    /// Adds the `Allow` header (for a 405).
    pub(crate) fn with_allow(mut self, method: &'static str) -> ApiError {
        self.allow = Some(method);
        self
    }

    pub(crate) fn into_response(self) -> Response<Body> {
        let mut body = json!({ "error": self.message });
        if let (Some(Value::Object(extra)), Value::Object(map)) = (self.extra, &mut body) {
            map.extend(extra);
        }
        let mut r = json_response(self.status, &body);
        if let Some(allow) = self.allow {
            r.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static(allow));
        }
        r
    }
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

pub(crate) fn ok(body: Value) -> Result<Response<Body>, ApiError> {
    Ok(json_response(StatusCode::OK, &body))
}

pub(crate) fn app_of<'a>(state: &'a State, name: &str) -> Result<&'a Arc<App>, ApiError> {
    state.apps.get(name).ok_or_else(|| {
        let known: Vec<&str> = state.apps.keys().map(String::as_str).collect();
        ApiError::not_found(format!("unknown app `{name}` (served: {})", known.join(", ")))
    })
}

/// Reserves room for a request's body (its `content-length`, or `max_body_bytes`
/// when it does not say) in the budget of bodies being read and parsed at once
/// (`body_budget_bytes`); without room, 503 at once. The reservation is released
/// when the returned permit is dropped, after parsing.
pub(crate) fn reserve_body(
    state: &State,
    req: &Request<Incoming>,
) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    let limit = state.config.max_body_bytes;
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    // Over the limit: read_body answers 413; reserve nothing for it.
    let bytes = declared.unwrap_or(limit).min(limit);
    let kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    state.body_budget.clone().try_acquire_many_owned(kib).map_err(|_| budget_full(state))
}

/// The answer when request bodies fill `body_budget_bytes` (both fronts: 503 here,
/// UNAVAILABLE on gRPC).
pub(crate) fn budget_full(state: &State) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "busy: other requests' bodies fill body_budget_bytes = {}; retry later",
            state.config.body_budget_bytes
        ),
    )
}

/// Reads the body, refusing anything over `max_body_bytes` with 413.
pub(crate) async fn read_body(state: &State, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    read_body_up_to(state, req, state.config.max_body_bytes).await
}

/// As [`read_body`], with `limit` bytes instead of `max_body_bytes` (a policy
/// upload: the registry's own limit).
pub(crate) async fn read_body_up_to(state: &State, req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    if let Some(len) = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body of {len} bytes exceeds the limit of {limit}"),
            ));
        }
    }
    let timeout = std::time::Duration::from_millis(state.config.body_read_timeout_ms);
    let Ok(collected) = tokio::time::timeout(timeout, Limited::new(req.into_body(), limit).collect()).await else {
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within body_read_timeout_ms = {}", state.config.body_read_timeout_ms),
        ));
    };
    match collected {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("body exceeds the limit of {limit} bytes")))
        }
        Err(e) => Err(ApiError::bad_request(format!("could not read the body: {e}"))),
    }
}

pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// Maps registry errors: unknown → 404, a built-in's or reserved name → 409, too
/// large → 413, other bad input → 400, I/O → 500.
pub(crate) fn registry_error(e: RegistryError) -> ApiError {
    match e {
        RegistryError::Unknown(_) => ApiError::not_found(e.to_string()),
        RegistryError::Io { .. } => ApiError::internal(e),
        RegistryError::Builtin(_) | RegistryError::Reserved(_) => ApiError::new(StatusCode::CONFLICT, e.to_string()),
        RegistryError::TooLarge(_) => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        _ => ApiError::bad_request(e.to_string()),
    }
}

/// The peer address of a request's connection (put in its extensions by the
/// server's accept loop).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

/// Marks a request that came in on the separate admin listener (`admin_listen`).
#[derive(Clone, Copy, Debug)]
pub struct AdminListener;

/// Failed admin logins an address may make before its admin requests are slowed.
pub const LOGIN_FAILURES_ALLOWED: u32 = 10;

/// How long an address's failed logins are remembered: its count starts over once
/// it has not failed for this long (a steady guesser stays slowed).
pub const LOGIN_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The delay an admin request from a slowed address waits per failure beyond
/// [`LOGIN_FAILURES_ALLOWED`] ...
pub const LOGIN_DELAY_STEP: std::time::Duration = std::time::Duration::from_millis(250);

/// ... up to this.
pub const LOGIN_DELAY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Addresses tracked at most (beyond it, expired entries are swept, then the
/// oldest dropped: memory stays bounded whatever the attacker's address space).
const LOGIN_TRACKED_MAX: usize = 4096;

/// Failed admin logins per client address, which slow that address's admin
/// requests without ever refusing a right token.
///
/// After [`LOGIN_FAILURES_ALLOWED`] failures (none more than [`LOGIN_WINDOW`] after
/// the one before), every admin request from the address waits [`LOGIN_DELAY_STEP`]
/// per failure beyond them, up to [`LOGIN_DELAY_MAX`], before its token is checked;
/// then a right token is served and a wrong one gets its 401. The wait applies to
/// right tokens too: were a right token answered at once, a guesser would know a
/// guess wrong as soon as no answer came, and the delay would slow nothing. So an
/// address's guesses are bounded by the connections it may hold (its share of
/// `max_connections`, [`crate::server`]) over the delay, while an operator behind
/// the same proxy (or on localhost) as a guesser is slowed, never locked out: the
/// earlier rule (429 to every request from the address for the rest of a minute,
/// whatever the token) let anyone sharing the address lock the operator out. A
/// strong token is the defence against guessing (`admin_listen` on an internal
/// address the other); this only makes a weak one costly to guess. Failures are
/// logged at most once a second.
#[derive(Default)]
pub struct LoginGuard {
    /// Per address: when it last failed, and how many times in a row (each within
    /// [`LOGIN_WINDOW`] of the previous).
    failures: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>>,
    log: RateLimitedLog,
}

impl LoginGuard {
    /// How long an admin request from `ip` waits before its token is checked (zero
    /// while the address has failed fewer than [`LOGIN_FAILURES_ALLOWED`] times).
    pub fn delay(&self, ip: std::net::IpAddr) -> std::time::Duration {
        let map = self.failures.lock();
        match map.get(&ip) {
            Some((last, n)) if *n >= LOGIN_FAILURES_ALLOWED && last.elapsed() < LOGIN_WINDOW => {
                LOGIN_DELAY_STEP.saturating_mul(n - LOGIN_FAILURES_ALLOWED + 1).min(LOGIN_DELAY_MAX)
            }
            _ => std::time::Duration::ZERO,
        }
    }

    /// Counts a failed login from `ip`.
    pub fn failed(&self, ip: std::net::IpAddr, why: &str) {
        let now = std::time::Instant::now();
        let n = {
            let mut map = self.failures.lock();
            if map.len() >= LOGIN_TRACKED_MAX && !map.contains_key(&ip) {
                map.retain(|_, (last, _)| last.elapsed() < LOGIN_WINDOW);
                if map.len() >= LOGIN_TRACKED_MAX {
                    if let Some(oldest) = map.iter().min_by_key(|(_, (last, _))| *last).map(|(k, _)| *k) {
                        map.remove(&oldest);
                    }
                }
            }
            let entry = map.entry(ip).or_insert((now, 0));
            if entry.0.elapsed() >= LOGIN_WINDOW {
                entry.1 = 0;
            }
            *entry = (now, entry.1.saturating_add(1));
            entry.1
        };
        self.log.warn(
            |suppressed| tracing::warn!(%ip, failures = n, "failed admin login: {why} ({suppressed} more not logged)"),
        );
    }
}

/// A warning written at most once a second; the ones in between are counted and
/// the count goes with the next line written. For what an attacker or a faulting
/// policy can repeat at line rate (failed accepts, logins, policy faults).
#[derive(Default)]
pub struct RateLimitedLog {
    state: parking_lot::Mutex<(Option<std::time::Instant>, u64)>,
}

impl RateLimitedLog {
    /// Calls `log` with the number of warnings not written since the last one,
    /// unless one was written less than a second ago.
    pub fn warn(&self, log: impl FnOnce(u64)) {
        let now = std::time::Instant::now();
        let suppressed = {
            let mut state = self.state.lock();
            if state.0.is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(1)) {
                state.1 += 1;
                return;
            }
            state.0 = Some(now);
            std::mem::take(&mut state.1)
        };
        log(suppressed);
    }
}
