//! What the HTTP front and the admin API share at the edge: the response body type,
//! the one error type [`ApiError`] (a status and an `{"error": "..."}` body; client
//! errors echo what was wrong, server errors log the cause and say nothing more;
//! refusals add their typed `reason`, [`ApiError::refused`]),
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
use sluice_core::outcome::Refusal;
use sluice_core::registry::RegistryError;

impl From<crate::binary::BinaryError> for ApiError {
    fn from(e: crate::binary::BinaryError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

impl From<crate::evaluate::EvaluateError> for ApiError {
    fn from(e: crate::evaluate::EvaluateError) -> ApiError {
        use crate::evaluate::EvaluateError as E;
        match e {
            E::Unavailable => ApiError::new(StatusCode::NOT_IMPLEMENTED, e.to_string()),
            E::UnknownApp { .. } => ApiError::not_found(e.to_string()),
            e if e.is_bad_request() => ApiError::bad_request(e.to_string()),
            e if e.is_conflict() => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            E::Busy { running, .. } => ApiError {
                extra: Some(json!({ "running": running })),
                ..ApiError::new(StatusCode::CONFLICT, e.to_string())
            },
            E::Registry(r) => registry_error(r),
            e => ApiError::internal(e),
        }
    }
}

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

    /// A request refused for `refusal`, in `message`'s words: 429 for an overload
    /// or a full queue (retry later), 503 at shutdown. The body adds
    /// `"refused": true` and `"reason"`: [`Refusal::as_str`], the one spelling a
    /// client can match on (`error` stays words for people; tritonclient shows
    /// it). A drop's body has `"dropped": true` and its reason the same way.
    pub(crate) fn refused(refusal: Refusal, message: impl Into<String>) -> ApiError {
        let status = match refusal {
            Refusal::Overload | Refusal::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            Refusal::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError {
            extra: Some(json!({ "refused": true, "reason": refusal.as_str() })),
            ..ApiError::new(status, message)
        }
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

/// Whether the client sent `Expect: 100-continue`: it waits for a `100 Continue`
/// before it sends the body.
fn expects_continue(req: &Request<Incoming>) -> bool {
    req.headers().get(hyper::header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The answer to a request refused from its head alone (an unknown app, an
/// overloaded one, a version-pinned inference, a refused admin token, a reserved
/// policy name), its body unread or thrown away:
/// - a client that sent `Expect: 100-continue` waits for a `100 Continue` before it
///   sends the body, and hyper writes that `100` only when the body is first read.
///   The body is not touched: the final status goes instead of the `100`, as RFC
///   9110 §10.1.1 allows (curl sends `Expect` above 1 MB: a 4 MB image refused
///   after its upload cost the client the upload). The answer says
///   `Connection: close`: the announced body never came, so the connection cannot
///   carry another request (hyper closes it once the unread body is dropped).
/// - any other client is already sending: the body is read and thrown away (within
///   the body timeout, up to `max_body_bytes`) before answering, so it sees the
///   answer rather than a connection reset under its upload.
pub(crate) async fn refuse_before_body(state: &State, req: Request<Incoming>, error: ApiError) -> Response<Body> {
    if expects_continue(&req) {
        drop(req);
        let mut r = error.into_response();
        r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
        return r;
    }
    discard_body(state, req).await;
    error.into_response()
}

/// Reads and throws away a request's body (within the body timeout, up to
/// `max_body_bytes`).
async fn discard_body(state: &State, req: Request<Incoming>) {
    use http_body_util::BodyExt as _;
    let mut body = req.into_body();
    let limit = state.config.max_body_bytes;
    let timeout = std::time::Duration::from_millis(state.config.body_read_timeout_ms);
    let _ = tokio::time::timeout(timeout, async {
        let mut read = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, |d| d.len());
            if read > limit {
                break;
            }
        }
    })
    .await;
}
