//! The HTTP front: routing, the Open Inference Protocol, the simple `/infer`
//! endpoint and metrics; `/admin` is handed to [`crate::admin`]. Errors are
//! [`ApiError`]s (`crate::api`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::{app_of, json_response, ok, parse_json, read_body, refuse_before_body, ApiError, Body};
use crate::binary;
use crate::infer::{self, pinned_version, target, Data, Input, NotATensor, Output, Target, Unsupported};
use crate::state::State;
use sluice_core::tensor::{Tensor, TensorData};

/// Routes one request; the answer is compressed when the client accepts it
/// ([`encoding::accepted`]) and tells an HTTP/1.1 client how long its idle
/// connection is kept ([`keep_alive`]).
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let http11 = req.version() == hyper::Version::HTTP_11;
    let accepted = encoding::accepted(req.headers());
    let response = match route(&state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    let mut response = match accepted {
        Some(coding) => encoding::compress(response, coding).await,
        None => response,
    };
    if http11 {
        keep_alive(&state, &mut response);
    }
    response
}

/// Says `Keep-Alive: timeout=N` on an answer whose connection stays open: an idle
/// keep-alive connection is closed after `header_read_timeout_ms` (hyper's timer
/// runs while it waits for the next request's head) or `idle_timeout_ms`,
/// whichever is shorter (`crate::server`). Without the hint a pooled client
/// reused a socket the server had just closed (10 s, issue 40); with it, clients
/// that read it (browsers, undici, Go's and Java's pools can be set to) retire the
/// socket first. Whole seconds, rounded down, so the hint is never late; below one
/// second, none is sent.
fn keep_alive(state: &State, response: &mut Response<Body>) {
    let closes =
        response.headers().get(hyper::header::CONNECTION).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let idle_ms = state.config.header_read_timeout_ms.min(state.config.idle_timeout_ms);
    if closes || idle_ms < 1000 {
        return;
    }
    let value = format!("timeout={}", idle_ms / 1000);
    if let Ok(v) = hyper::header::HeaderValue::from_str(&value) {
        response.headers_mut().insert(hyper::header::HeaderName::from_static("keep-alive"), v);
    }
}

async fn route(state: &Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    // With a separate admin listener, each listener serves its own half.
    if state.config.admin_listen.is_some() {
        let on_admin = req.extensions().get::<crate::api::AdminListener>().is_some();
        let admin_route = matches!(segments.as_slice(), ["admin", ..] | ["metrics"] | ["dashboard", ..]);
        if on_admin && !admin_route {
            return Err(ApiError::not_found(format!(
                "no route for {method} {path} on the admin listener (it serves /admin, /dashboard and /metrics)"
            )));
        }
        if !on_admin && matches!(segments.first(), Some(&"admin") | Some(&"dashboard")) {
            return Err(ApiError::not_found(format!("no route for {method} {path}")));
        }
    }
    match (&method, segments.as_slice()) {
        (&Method::GET, ["v2", "health", "live"]) => ok(json!({ "live": true })),
        (&Method::GET, ["v2", "health", "ready"]) => {
            let ready = state.apps.values().all(|a| a.accepting.load(Ordering::Acquire));
            let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            Ok(json_response(status, &json!({ "ready": ready })))
        }
        (&Method::GET, ["v2"]) => ok(
            json!({ "name": "sluice", "version": env!("CARGO_PKG_VERSION"), "extensions": crate::infer::EXTENSIONS }),
        ),
        (&Method::GET, ["v2", "models", "stats"]) => statistics(state, None, ""),
        (&Method::GET, ["v2", "models", app]) => metadata(&target(state, app)?, ""),
        (&Method::GET, ["v2", "models", app, "versions", v]) => metadata(&target(state, app)?, v),
        (&Method::GET, ["v2", "models", app, "ready"]) => ready(&target(state, app)?, ""),
        (&Method::GET, ["v2", "models", app, "versions", v, "ready"]) => ready(&target(state, app)?, v),
        (&Method::GET, ["v2", "models", app, "config"]) => model_config(&target(state, app)?, ""),
        (&Method::GET, ["v2", "models", app, "versions", v, "config"]) => model_config(&target(state, app)?, v),
        (&Method::GET, ["v2", "models", app, "stats"]) => statistics(state, Some(app), ""),
        (&Method::GET, ["v2", "models", app, "versions", v, "stats"]) => statistics(state, Some(app), v),
        (&Method::POST, ["v2", "models", app, "versions", v, "infer"]) => {
            // The policy picks the variant: a version-pinned inference is refused
            // (404 for a version the app does not have), from its head.
            let e = match target(state, app).and_then(|t| t.check_version(v)) {
                Ok(()) => pinned_version(app, v),
                Err(e) => e,
            };
            Ok(refuse_before_body(state, req, e).await)
        }
        (&Method::POST, ["v2", "repository", "index"]) => {
            let coding = encoding::of_request(&req)?;
            let _budget = crate::api::reserve_body(state, &req)?;
            let (body, _inflated) = encoding::decode(state, coding, read_body(state, req).await?).await?;
            repository_index(state, &body)
        }
        (&Method::POST, ["v2", "repository", "models", m, action @ ("load" | "unload")]) => {
            let e = Unsupported::RepositoryControl.error(&format!("cannot {action} `{m}`"));
            Ok(refuse_before_body(state, req, e).await)
        }
        // The protocol's extensions sluice does not serve, on any method: 501 naming
        // what is not supported (never a 404 a client could take for a typo).
        (
            _,
            ["v2", area @ ("systemsharedmemory" | "cudasharedmemory"), _]
            | ["v2", area @ ("systemsharedmemory" | "cudasharedmemory"), "region", _, _],
        ) => {
            let kind = if *area == "cudasharedmemory" {
                Unsupported::CudaSharedMemory
            } else {
                Unsupported::SystemSharedMemory
            };
            let e = kind.error(&format!("{method} {path}"));
            Ok(refuse_before_body(state, req, e).await)
        }
        (_, ["v2", "trace", "setting"] | ["v2", "models", _, "trace", "setting"]) => {
            let e = Unsupported::Trace.error(&format!("{method} {path}"));
            Ok(refuse_before_body(state, req, e).await)
        }
        (_, ["v2", "logging"]) => {
            let e = Unsupported::Logging.error(&format!("{method} {path}"));
            Ok(refuse_before_body(state, req, e).await)
        }
        (
            _,
            ["v2", "models", _, "generate" | "generate_stream"]
            | ["v2", "models", _, "versions", _, "generate" | "generate_stream"],
        ) => {
            let e = Unsupported::Generate.error(&format!("{method} {path}"));
            Ok(refuse_before_body(state, req, e).await)
        }
        (&Method::POST, ["v2", "models", app, "infer"]) => {
            let arrived = std::time::Instant::now();
            // Errors found before the body is read (an unknown app, an overloaded
            // one, a bad framing header, no room to read it) are answered from the
            // head ([`refuse_before_body`]). Past the precheck, the request counts
            // as incoming (ahead of later arrivals) until its body is parsed.
            let admitted = target(state, app).and_then(|t| Ok((t.precheck()?, t)));
            let early = admitted.and_then(|(incoming, t)| {
                let coding = encoding::of_request(&req)?;
                let budget = crate::api::reserve_body(state, &req)?;
                Ok((t, incoming, budget, binary::header_length(&req)?, coding))
            });
            let (target, incoming, budget, json_len, coding) = match early {
                Ok(x) => x,
                Err(e) => return Ok(refuse_before_body(state, req, e).await),
            };
            let audited = incoming.as_ref().is_some_and(crate::app::Incoming::audited);
            let (request, data) = {
                let (_incoming, _budget) = (incoming, budget);
                let (body, _inflated) = encoding::decode(state, coding, read_body(state, req).await?).await?;
                let (json, data) = binary::split(body, json_len)?;
                (parse_off_thread::<InferRequest>(json).await?, data)
            };
            infer(&target, request, data, arrived, audited).await
        }
        (&Method::POST, ["infer"]) => {
            let arrived = std::time::Instant::now();
            let early = encoding::of_request(&req)
                .and_then(|coding| Ok((crate::api::reserve_body(state, &req)?, binary::header_length(&req)?, coding)));
            let (budget, json_len, coding) = match early {
                Ok(x) => x,
                Err(e) => return Ok(refuse_before_body(state, req, e).await),
            };
            let (request, data) = {
                let _budget = budget;
                let (body, _inflated) = encoding::decode(state, coding, read_body(state, req).await?).await?;
                let (json, data) = binary::split(body, json_len)?;
                (parse_off_thread::<SimpleInferRequest>(json).await?, data)
            };
            let target = target(state, &request.app)?;
            let request = InferRequest {
                id: request.id,
                inputs: request.inputs,
                outputs: request.outputs,
                parameters: request.parameters,
            };
            infer(&target, request, data, arrived, false).await
        }
        (&Method::GET, ["metrics"]) => {
            let mut text = state.metrics.render();
            queue_gauges(state, &mut text);
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            Ok(r)
        }
        // The operator's page (its data comes from /admin/dashboard, behind the token).
        (&Method::GET, ["dashboard"]) => crate::dashboard::asset(None),
        (&Method::GET, ["dashboard", file]) => crate::dashboard::asset(Some(file)),
        (_, ["admin", ..]) => {
            if let Err(e) = authorize(state, &req).await {
                return Ok(refuse_before_body(state, req, e).await);
            }
            crate::admin::route(state, req, &segments[1..]).await
        }
        (_, route) => match allowed(route) {
            // A known route with another method: 405 naming the one it takes, unless
            // it names an app that does not exist (then 404, as for every method).
            Some(allow) => {
                if let ["v2", "models", app, ..] = route {
                    if !state.pipelines.contains_key(*app) {
                        app_of(state, app)?;
                    }
                }
                Err(ApiError::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("{method} not allowed on {path}; use {allow}"),
                )
                .with_allow(allow))
            }
            None => Err(ApiError::not_found(format!("no route for {method} {path}"))),
        },
    }
}

/// Gauges read from the apps when scraped: requests queued and in running batches,
/// and admission's margin.
fn queue_gauges(state: &State, out: &mut String) {
    use std::fmt::Write as _;
    // Named for what they count (`_requests`), as Prometheus' naming guide asks of
    // a gauge without a base unit (issue 38; they were `sluice_queue_depth` and
    // `sluice_in_flight`).
    let _ =
        writeln!(out, "# HELP sluice_queued_requests Requests queued, by app.\n# TYPE sluice_queued_requests gauge");
    for (name, app) in &state.apps {
        let _ = writeln!(out, "sluice_queued_requests{{app=\"{name}\"}} {}", app.queued.load(Ordering::Relaxed));
    }
    let _ = writeln!(
        out,
        "# HELP sluice_in_flight_requests Requests in running batches, by app.\n# TYPE sluice_in_flight_requests gauge"
    );
    for (name, app) in &state.apps {
        let running: usize = app.workers.iter().map(|w| w.in_flight.load(Ordering::Relaxed)).sum();
        let _ = writeln!(out, "sluice_in_flight_requests{{app=\"{name}\"}} {running}");
    }
    let _ = writeln!(
        out,
        "# HELP sluice_admission_margin_seconds The margin admission adds to its predictions (the 99th percentile of recent prediction errors, plus that of the time from a batch's end to its answer reaching the front), by app.\n# TYPE sluice_admission_margin_seconds gauge"
    );
    for (name, app) in &state.apps {
        let _ = writeln!(out, "sluice_admission_margin_seconds{{app=\"{name}\"}} {}", app.margin_us() / 1e6);
    }
}

/// The method a known route takes (None: no such route).
fn allowed(route: &[&str]) -> Option<&'static str> {
    match route {
        ["v2"]
        | ["v2", "health", "live" | "ready"]
        | ["v2", "models", _]
        | ["v2", "models", _, "ready" | "config" | "stats"]
        | ["v2", "models", _, "versions", _]
        | ["v2", "models", _, "versions", _, "ready" | "config" | "stats"]
        | ["metrics"]
        | ["dashboard"]
        | ["dashboard", _] => Some("GET"),
        ["v2", "models", _, "infer"]
        | ["v2", "models", _, "versions", _, "infer"]
        | ["v2", "repository", "index"]
        | ["v2", "repository", "models", _, "load" | "unload"]
        | ["infer"] => Some("POST"),
        _ => None,
    }
}

/// Checks the admin bearer token; an address that failed too often waits first
/// ([`crate::throttle::LoginGuard`]: failures are slowed, a right token is never refused).
async fn authorize(state: &State, req: &Request<Incoming>) -> Result<(), ApiError> {
    let Some(token) = &state.admin_token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin API disabled: set admin_token in the config or SLUICE_ADMIN_TOKEN",
        ));
    };
    // Counted per client as connections are: an IPv4 address, an IPv6 /64.
    let ip = req.extensions().get::<crate::api::Peer>().map(|p| crate::conn::client_of(p.0.ip()));
    let delay = ip.map(|ip| state.logins.delay(ip)).unwrap_or_default();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let refused = match given {
        // Constant-time comparison: the token must not leak through timing.
        Some(g)
            if g.len() == token.len() && g.bytes().zip(token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0 =>
        {
            return Ok(());
        }
        Some(_) => "invalid admin token",
        None => "admin API requires `Authorization: Bearer <token>`",
    };
    if let Some(ip) = ip {
        state.logins.failed(ip, refused);
    }
    Err(ApiError::new(StatusCode::UNAUTHORIZED, refused))
}

/// An Open Inference Protocol inference request.
#[derive(Deserialize)]
struct InferRequest {
    #[serde(default)]
    id: Option<String>,
    inputs: Vec<InputTensor>,
    /// Requested outputs: every app answers with one, [`OUTPUT_NAME`]; another
    /// name is refused. `parameters.binary_data` asks for it in binary.
    #[serde(default)]
    outputs: Option<Vec<RequestedOutput>>,
    /// Request parameters: `binary_data_output` is honoured; others are accepted
    /// and not used.
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
struct RequestedOutput {
    name: String,
    #[serde(default)]
    parameters: Option<Value>,
}

/// The simple `/infer` request: the OIP body plus the app name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimpleInferRequest {
    app: String,
    #[serde(default)]
    id: Option<String>,
    inputs: Vec<InputTensor>,
    #[serde(default)]
    outputs: Option<Vec<RequestedOutput>>,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
struct InputTensor {
    name: String,
    shape: Vec<usize>,
    datatype: String,
    /// JSON data; absent when `parameters.binary_data_size` puts it after the JSON.
    #[serde(default)]
    data: Option<JsonData>,
    #[serde(default)]
    parameters: Option<Value>,
}

/// Tensor data, flat or nested (the protocol allows both), flattened while parsing
/// so a large image never becomes a tree of `serde_json::Value`s. Its nesting is
/// recorded (the length at each depth) and checked as it goes: a ragged array, or
/// an element that is not a number (a boolean, a string, null, an object), makes
/// it no tensor, kept as the reason ([`Data::Numbers`]) so that the refusal names
/// the input (a serde error here could only say "invalid JSON body"; booleans were
/// taken as 0 and 1 and ragged arrays flattened, issue 40).
struct JsonData {
    values: Vec<f64>,
    nesting: Result<Vec<usize>, NotATensor>,
}

/// What [`JsonData`]'s parser has seen of the array's structure.
#[derive(Default)]
struct Nesting {
    /// Per depth: whether arrays (`Some(true)`) or numbers (`Some(false)`) are there
    /// (the first seen; the others must agree).
    arrays: Vec<Option<bool>>,
    /// Per depth: the length of its arrays (the first finished; the others must
    /// agree).
    dims: Vec<Option<usize>>,
    /// Leaves seen (numbers or not): the index of the next element.
    leaves: usize,
    /// The first thing that makes the data no tensor.
    problem: Option<NotATensor>,
}

impl Nesting {
    fn fail(&mut self, problem: NotATensor) {
        if self.problem.is_none() {
            self.problem = Some(problem);
        }
    }

    /// Something at `depth`: an array or a number; they may not be side by side.
    fn enter(&mut self, depth: usize, array: bool) {
        if self.arrays.len() <= depth {
            self.arrays.resize(depth + 1, None);
        }
        match self.arrays[depth] {
            Some(a) if a != array => self.fail(NotATensor::Mixed { depth: depth + 1 }),
            Some(_) => {}
            None => self.arrays[depth] = Some(array),
        }
    }

    /// An array of `len` elements ended at `depth`: arrays at one depth are alike.
    fn array(&mut self, depth: usize, len: usize) {
        if self.dims.len() <= depth {
            self.dims.resize(depth + 1, None);
        }
        match self.dims[depth] {
            Some(d) if d != len => self.fail(NotATensor::Ragged { first: d, len, depth: depth + 1 }),
            Some(_) => {}
            None => self.dims[depth] = Some(len),
        }
    }

    fn leaf(&mut self, depth: usize, not_a_number: Option<&str>) {
        if let Some(what) = not_a_number {
            self.fail(NotATensor::NotANumber { index: self.leaves, what: what.to_string() });
        }
        self.leaves += 1;
        self.enter(depth, false);
    }

    /// The lengths at each depth (one entry for a flat array, none for a number),
    /// or what makes the data no tensor.
    fn finish(self) -> Result<Vec<usize>, NotATensor> {
        match self.problem {
            Some(p) => Err(p),
            None => Ok(self.dims.into_iter().map_while(|d| d).collect()),
        }
    }
}

impl<'de> Deserialize<'de> for JsonData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a> {
            values: &'a mut Vec<f64>,
            nesting: &'a mut Nesting,
            depth: usize,
        }
        impl<'de> de::DeserializeSeed<'de> for V<'_> {
            type Value = ();
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_any(self)
            }
        }
        impl V<'_> {
            fn number(self, v: f64) {
                self.values.push(v);
                self.nesting.leaf(self.depth, None);
            }
            fn other(self, what: &str) {
                self.nesting.leaf(self.depth, Some(what));
            }
        }
        impl<'de> Visitor<'de> for V<'_> {
            type Value = ();
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("numbers or (nested) arrays of numbers")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
                self.number(v);
                Ok(())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
                self.number(v as f64);
                Ok(())
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
                self.number(v as f64);
                Ok(())
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
                self.other(&format!("a boolean ({v})"));
                Ok(())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
                self.other("a string");
                Ok(())
            }
            fn visit_unit<E: de::Error>(self) -> Result<(), E> {
                self.other("null");
                Ok(())
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
                while map.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {}
                self.other("an object");
                Ok(())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                if self.depth == 0 {
                    if let Some(n) = seq.size_hint() {
                        self.values.reserve(n);
                    }
                }
                self.nesting.enter(self.depth, true);
                let mut len = 0;
                while seq
                    .next_element_seed(V {
                        values: &mut *self.values,
                        nesting: &mut *self.nesting,
                        depth: self.depth + 1,
                    })?
                    .is_some()
                {
                    len += 1;
                }
                self.nesting.array(self.depth, len);
                Ok(())
            }
        }
        let (mut values, mut nesting) = (Vec::new(), Nesting::default());
        de::DeserializeSeed::deserialize(V { values: &mut values, nesting: &mut nesting, depth: 0 }, d)?;
        Ok(JsonData { values, nesting: nesting.finish() })
    }
}

/// The request's inputs in the shared form ([`infer::Input`]): JSON data, or this
/// input's share of the binary data after the JSON (the extension's inputs take
/// their `binary_data_size` bytes in input order).
fn decode_inputs(app: &str, inputs: Vec<InputTensor>, binary: Bytes) -> Result<Vec<Input>, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("app {app}: {m}"));
    if !binary.is_empty()
        && !inputs.iter().any(|i| i.parameters.as_ref().and_then(|p| p.get("binary_data_size")).is_some())
    {
        return Err(bad(format!("{} bytes of binary data but no input has binary_data_size", binary.len())));
    }
    let mut rest = binary;
    let mut out = Vec::with_capacity(inputs.len());
    for input in inputs {
        let size =
            binary::data_size(input.parameters.as_ref()).map_err(|m| bad(format!("input `{}`: {m}", input.name)))?;
        let data = match (input.data, size) {
            (Some(_), Some(_)) => {
                return Err(bad(format!("input `{}`: both `data` and binary_data_size given", input.name)));
            }
            (None, None) => return Err(bad(format!("input `{}`: no `data` (nor binary_data_size)", input.name))),
            (Some(JsonData { values, nesting }), None) => Data::Numbers { values, nesting },
            (None, Some(size)) => {
                let bytes = rest.split_to(size.min(rest.len()));
                Data::Bytes { bytes, declared: Some(size), source: "binary_data_size" }
            }
        };
        let shape = input.shape.iter().map(|d| i64::try_from(*d).unwrap_or(i64::MAX)).collect();
        out.push(Input { name: input.name, datatype: input.datatype, shape, data });
    }
    if !rest.is_empty() {
        return Err(bad(format!("the body carries {} bytes after the inputs' binary data", rest.len())));
    }
    Ok(out)
}

/// A tensor's elements as JSON numbers (finite ones: [`encode_outputs`] sends the
/// others in binary).
fn tensor_json(t: &Tensor) -> Value {
    match &t.data {
        TensorData::F32(v) => json!(v),
        TensorData::F64(v) => json!(v),
        TensorData::I32(v) => json!(v),
        TensorData::I64(v) => json!(v),
        TensorData::U8(v) => json!(v),
    }
}

/// Bodies larger than this are parsed on the blocking pool: parsing a JSON image
/// takes milliseconds, which on the async threads would hold up every connection.
const PARSE_INLINE_MAX: usize = 64 << 10;

async fn parse_off_thread<T: for<'de> Deserialize<'de> + Send + 'static>(json: Bytes) -> Result<T, ApiError> {
    if json.len() <= PARSE_INLINE_MAX {
        return parse_json(&json);
    }
    tokio::task::spawn_blocking(move || parse_json(&json)).await.map_err(ApiError::internal)?
}

/// Which outputs go back in binary: every output when the request says
/// `binary_data_output`, or the requested ones that say `binary_data`.
fn binary_outputs<'a>(
    parameters: Option<&'a Value>,
    outputs: &'a Option<Vec<RequestedOutput>>,
) -> impl Fn(&str) -> bool + 'a {
    let all_binary = binary::flag(parameters, "binary_data_output");
    move |name: &str| {
        all_binary
            || outputs.iter().flatten().any(|o| o.name == name && binary::flag(o.parameters.as_ref(), "binary_data"))
    }
}

/// The classification extension's counts: each requested output's
/// `parameters.classification` (tritonclient's `class_count`), 0 where not asked.
fn class_counts(outputs: &Option<Vec<RequestedOutput>>) -> Result<Vec<(String, u64)>, ApiError> {
    let mut counts = Vec::new();
    for o in outputs.iter().flatten() {
        if let Some(v) = o.parameters.as_ref().and_then(|p| p.get("classification")) {
            let k = v.as_u64().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "output `{}`: parameters.classification: expected a class count (an integer >= 0), got {v}",
                    o.name
                ))
            })?;
            counts.push((o.name.clone(), k));
        }
    }
    Ok(counts)
}

/// An output's entry in the answer. Its fields are in the order a
/// `serde_json::Map` (sorted keys) gave them before the answer was serialised
/// from a struct, so the bytes are the same.
#[derive(Serialize)]
struct OutputEntry<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
    datatype: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    shape: &'a [usize],
}

/// The answer's body: serialised straight from this struct rather than built as a
/// `serde_json::Value` tree first (a map allocated and sorted per answer), in the
/// sorted order of the tree it replaces.
#[derive(Serialize)]
struct InferResponse<'a> {
    /// The request's id, echoed; absent when it sent none (as Triton: not `null`).
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    model_name: String,
    model_version: String,
    outputs: Vec<OutputEntry<'a>>,
    parameters: serde_json::Map<String, Value>,
}

/// The outputs as JSON entries and the binary tail. An output goes in binary when
/// asked, and also when JSON cannot carry it: a NaN or an infinity (the model's
/// business, as any value is: Triton returns them) has no JSON number, and an
/// answer of `null`s would be no tensor at all. The entry's `binary_data_size` says
/// so, which tritonclient reads whatever it asked.
fn encode_outputs(outputs: &[Output], binary_out: impl Fn(&str) -> bool) -> (Vec<OutputEntry<'_>>, Vec<u8>) {
    let mut tail = Vec::new();
    let mut entries = Vec::with_capacity(outputs.len());
    for o in outputs {
        let in_json = !binary_out(o.name())
            && match o {
                Output::Tensor(t) => t.data.first_non_finite().is_none(),
                Output::Classes { .. } => true,
            };
        let mut entry =
            OutputEntry { data: None, datatype: o.datatype(), name: o.name(), parameters: None, shape: o.shape() };
        if in_json {
            entry.data = Some(match o {
                Output::Tensor(t) => tensor_json(t),
                Output::Classes { values, .. } => json!(values),
            });
        } else {
            let bytes = match o {
                Output::Tensor(t) => t.data.to_le_bytes(),
                Output::Classes { values, .. } => infer::bytes_elements(values),
            };
            entry.parameters = Some(json!({ "binary_data_size": bytes.len() }));
            tail.extend(bytes);
        }
        entries.push(entry);
    }
    (entries, tail)
}

/// A 200 with `body` (JSON), and the binary tail after it when there is one.
fn respond(body: &impl Serialize, tail: Vec<u8>) -> Result<Response<Body>, ApiError> {
    let mut bytes = serde_json::to_vec(body).map_err(ApiError::internal)?;
    let json_len = bytes.len();
    let binary = !tail.is_empty();
    bytes.extend(tail);
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    let h = r.headers_mut();
    if binary {
        h.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/octet-stream"));
        h.insert(binary::HEADER, hyper::header::HeaderValue::from(json_len));
    } else {
        h.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    }
    Ok(r)
}

/// Runs an inference through the shared path ([`crate::infer`]) and answers it in
/// the HTTP form (JSON, or JSON and a binary tail).
async fn infer(
    target: &Target,
    request: InferRequest,
    data: Bytes,
    arrived: std::time::Instant,
    audited: bool,
) -> Result<Response<Body>, ApiError> {
    let InferRequest { id, inputs, outputs, parameters } = request;
    let requested: Vec<&str> = outputs.iter().flatten().map(|o| o.name.as_str()).collect();
    target.check_outputs(&requested)?;
    let counts = class_counts(&outputs)?;
    let inputs = decode_inputs(target.name(), inputs, data)?;
    let answer = target.infer(id.as_deref(), inputs, arrived, audited).await?;
    let answered = infer::classify(target, answer.outputs, &counts);
    let (entries, tail) = encode_outputs(&answered, binary_outputs(parameters.as_ref(), &outputs));
    let body = InferResponse {
        id,
        model_name: answer.model_name,
        model_version: answer.model_version,
        outputs: entries,
        parameters: answer.parameters,
    };
    respond(&body, tail)
}

/// Model metadata in the HTTP form.
fn metadata(target: &Target, version: &str) -> Result<Response<Body>, ApiError> {
    let m = target.metadata(version)?;
    let tensors = |ts: &[(String, String, Vec<i64>)]| -> Vec<Value> {
        ts.iter().map(|(name, datatype, shape)| json!({ "name": name, "datatype": datatype, "shape": shape })).collect()
    };
    ok(json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": tensors(&m.inputs),
        "outputs": tensors(&m.outputs),
        "parameters": m.parameters,
    }))
}

/// Readiness of a target (or one of its variants): 200 or 503 with `{name, ready}`.
fn ready(target: &Target, version: &str) -> Result<Response<Body>, ApiError> {
    let ready = target.ready(version)?;
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    Ok(json_response(status, &json!({ "name": target.name(), "ready": ready })))
}

/// The model configuration extension, in Triton's JSON form.
fn model_config(target: &Target, version: &str) -> Result<Response<Body>, ApiError> {
    let c = target.config(version)?;
    let tensors = |ts: &[(String, String, Vec<i64>)]| -> Vec<Value> {
        ts.iter()
            .map(
                |(name, datatype, dims)| json!({ "name": name, "data_type": format!("TYPE_{datatype}"), "dims": dims }),
            )
            .collect()
    };
    let parameters: serde_json::Map<String, Value> =
        c.parameters.iter().map(|(k, v)| (k.clone(), json!({ "string_value": v }))).collect();
    let mut outputs = tensors(&c.outputs);
    if let Some(file) = &c.label_filename {
        for o in &mut outputs {
            o["label_filename"] = json!(file);
        }
    }
    ok(json!({
        "name": c.name,
        "platform": c.platform,
        "backend": "sluice",
        "max_batch_size": c.max_batch_size,
        "version_policy": { "all": {} },
        "input": tensors(&c.inputs),
        "output": outputs,
        "dynamic_batching": {},
        "parameters": parameters,
    }))
}

/// The statistics extension, in Triton's JSON form: every app, one app, or a
/// pipeline's task apps ([`infer::statistics`]).
fn statistics(state: &State, name: Option<&str>, version: &str) -> Result<Response<Body>, ApiError> {
    let duration = |count: u64, ns: u64| json!({ "count": count, "ns": ns });
    let stats: Vec<Value> = infer::statistics(state, name.unwrap_or_default(), version)?
        .into_iter()
        .map(|s| {
            json!({
                "name": s.name,
                "version": infer::STATS_VERSION,
                "last_inference": 0,
                "inference_count": s.served,
                "execution_count": s.executions,
                "inference_stats": {
                    "success": duration(s.served, s.latency_ns),
                    "fail": duration(s.failed, 0),
                    "queue": duration(s.served, s.queue_ns),
                    "compute_input": duration(s.served, 0),
                    "compute_infer": duration(s.served, s.compute_ns),
                    "compute_output": duration(s.served, 0),
                    "cache_hit": duration(0, 0),
                    "cache_miss": duration(0, 0),
                },
                "batch_stats": [],
            })
        })
        .collect();
    ok(json!({ "model_stats": stats }))
}

/// The repository index extension: `[{name, version, state, reason}]`.
fn repository_index(state: &State, body: &[u8]) -> Result<Response<Body>, ApiError> {
    #[derive(Deserialize, Default)]
    struct IndexRequest {
        #[serde(default)]
        ready: bool,
    }
    // tritonclient sends an empty body.
    let request: IndexRequest =
        if body.iter().all(u8::is_ascii_whitespace) { IndexRequest::default() } else { parse_json(body)? };
    let entries: Vec<Value> = infer::repository_index(state, request.ready)
        .into_iter()
        .map(|e| json!({ "name": e.name, "version": e.version, "state": e.state, "reason": e.reason }))
        .collect();
    ok(Value::Array(entries))
}

/// HTTP content codings: compressed request bodies (`Content-Encoding`, which
/// tritonclient sends with `request_compression_algorithm`) and compressed answers
/// (`Accept-Encoding`), gzip and deflate, as Triton's HTTP front offers them.
mod encoding {
    use std::io::{Read, Write};
    use std::sync::Arc;

    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Full};
    use hyper::body::Incoming;
    use hyper::header::{HeaderMap, HeaderValue, ACCEPT_ENCODING, CONTENT_ENCODING, VARY};
    use hyper::{Request, Response, StatusCode};
    use tokio::sync::OwnedSemaphorePermit;

    use crate::api::{ApiError, Body};
    use crate::state::State;

    /// A content coding sluice reads and writes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Coding {
        /// gzip (RFC 1952), `x-gzip` too.
        Gzip,
        /// `deflate`: zlib (RFC 1950) as RFC 9110 defines it; a raw deflate stream
        /// (what some clients send under that name) is read too.
        Deflate,
    }

    impl Coding {
        fn name(self) -> &'static str {
            match self {
                Coding::Gzip => "gzip",
                Coding::Deflate => "deflate",
            }
        }
    }

    /// Decompressed bodies are read in pieces of this size, each counted against
    /// `max_body_bytes` and the body budget before the next is read.
    const PIECE: usize = 64 << 10;

    /// Answers smaller than this go uncompressed whatever the client accepts: a few
    /// hundred bytes of JSON gain nothing worth the CPU (`identity` is always
    /// acceptable, RFC 9110 §12.5.3).
    const COMPRESS_MIN: usize = 1024;

    /// Bodies larger than this are (de)compressed on the blocking pool, as large
    /// bodies are parsed there.
    const INLINE_MAX: usize = super::PARSE_INLINE_MAX;

    /// The request body's coding, from its head: none (or `identity`), gzip or
    /// deflate; anything else is 415 naming what is accepted.
    pub(super) fn of_request(req: &Request<Incoming>) -> Result<Option<Coding>, ApiError> {
        let Some(v) = req.headers().get(CONTENT_ENCODING) else { return Ok(None) };
        let v = String::from_utf8_lossy(v.as_bytes()).trim().to_ascii_lowercase();
        match v.as_str() {
            "" | "identity" => Ok(None),
            "gzip" | "x-gzip" => Ok(Some(Coding::Gzip)),
            "deflate" => Ok(Some(Coding::Deflate)),
            other => Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "content-encoding `{other}` is not supported: send the body as is, gzip or deflate (one coding)"
                ),
            )),
        }
    }

    /// The body as sent, decompressed when it came compressed. A decompressed body
    /// is bounded as a plain one is: past `max_body_bytes` it is refused with 413
    /// while it is being decompressed (a small body that inflates to gigabytes is
    /// stopped at the limit, never held), and its size is taken from the body budget
    /// (`body_budget_bytes`) as it grows, held until the returned permit drops
    /// (after parsing); with no room, 503 as for any body.
    pub(super) async fn decode(
        state: &Arc<State>,
        coding: Option<Coding>,
        body: Bytes,
    ) -> Result<(Bytes, Option<OwnedSemaphorePermit>), ApiError> {
        let Some(coding) = coding else { return Ok((body, None)) };
        if body.len() <= INLINE_MAX {
            return inflate(state, coding, &body);
        }
        let state = state.clone();
        tokio::task::spawn_blocking(move || inflate(&state, coding, &body)).await.map_err(ApiError::internal)?
    }

    fn inflate(state: &State, coding: Coding, body: &[u8]) -> Result<(Bytes, Option<OwnedSemaphorePermit>), ApiError> {
        let mut reader: Box<dyn Read + '_> = match coding {
            Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(body)),
            // A zlib stream starts with a header whose 16 bits are a multiple of 31
            // and whose method is 8 (deflate); anything else is read as raw deflate.
            Coding::Deflate
                if body.len() >= 2
                    && body[0] & 0x0f == 8
                    && u16::from_be_bytes([body[0], body[1]]).is_multiple_of(31) =>
            {
                Box::new(flate2::read::ZlibDecoder::new(body))
            }
            Coding::Deflate => Box::new(flate2::read::DeflateDecoder::new(body)),
        };
        let limit = state.config.max_body_bytes;
        let mut out: Vec<u8> = Vec::with_capacity(body.len().saturating_mul(4).min(limit));
        let mut held: Option<OwnedSemaphorePermit> = None;
        let mut held_kib = 0usize;
        loop {
            let start = out.len();
            // Never more than one byte past the limit: that byte says it is over.
            let room = (limit + 1).saturating_sub(start).min(PIECE);
            out.resize(start + room, 0);
            let n = match reader.read(&mut out[start..]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
                Err(e) => {
                    return Err(ApiError::bad_request(format!(
                        "content-encoding {}: the body does not decompress: {e}",
                        coding.name()
                    )))
                }
            };
            out.truncate(start + n);
            if out.len() > limit {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "the body decompresses ({}) past the limit of {limit} bytes (max_body_bytes)",
                        coding.name()
                    ),
                ));
            }
            let kib = out.len().div_ceil(1024);
            if kib > held_kib {
                let more = u32::try_from(kib - held_kib).unwrap_or(u32::MAX);
                let permit = state
                    .body_budget
                    .clone()
                    .try_acquire_many_owned(more)
                    .map_err(|_| crate::api::budget_full(state))?;
                match &mut held {
                    Some(h) => h.merge(permit),
                    None => held = Some(permit),
                }
                held_kib = kib;
            }
            if n == 0 {
                break;
            }
        }
        Ok((Bytes::from(out), held))
    }

    /// The coding the client prefers among those sluice writes (`Accept-Encoding`,
    /// q-values honoured, gzip first on a tie; `*` counts as gzip), or none.
    pub(super) fn accepted(headers: &HeaderMap) -> Option<Coding> {
        let mut best: Option<(f32, Coding)> = None;
        for value in headers.get_all(ACCEPT_ENCODING) {
            let Ok(value) = value.to_str() else { continue };
            for item in value.split(',') {
                let mut parts = item.split(';');
                let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
                let q = parts
                    .filter_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()))
                    .next()
                    .unwrap_or(1.0);
                let coding = match name.as_str() {
                    "gzip" | "x-gzip" | "*" => Coding::Gzip,
                    "deflate" => Coding::Deflate,
                    _ => continue,
                };
                if q > 0.0 && best.is_none_or(|(b, c)| q > b || (q == b && coding == Coding::Gzip && c != Coding::Gzip))
                {
                    best = Some((q, coding));
                }
            }
        }
        best.map(|(_, c)| c)
    }

    /// The answer compressed with `coding` (fast level: the point is fewer bytes on
    /// a slow link for little CPU), unless it is small, already coded, or a 1xx/204.
    pub(super) async fn compress(response: Response<Body>, coding: Coding) -> Response<Body> {
        use http_body::Body as _;
        let small = response.body().size_hint().exact().is_none_or(|n| (n as usize) < COMPRESS_MIN);
        if small || response.headers().contains_key(CONTENT_ENCODING) {
            return response;
        }
        let (mut parts, body) = response.into_parts();
        let Ok(collected) = body.collect().await;
        let bytes = collected.to_bytes();
        let input = bytes.clone();
        let encode = move || -> std::io::Result<Vec<u8>> {
            let level = flate2::Compression::fast();
            let out = Vec::with_capacity(input.len() / 2);
            match coding {
                Coding::Gzip => {
                    let mut e = flate2::write::GzEncoder::new(out, level);
                    e.write_all(&input)?;
                    e.finish()
                }
                Coding::Deflate => {
                    let mut e = flate2::write::ZlibEncoder::new(out, level);
                    e.write_all(&input)?;
                    e.finish()
                }
            }
        };
        let compressed = if bytes.len() > INLINE_MAX {
            tokio::task::spawn_blocking(encode).await.ok().and_then(Result::ok)
        } else {
            encode().ok()
        };
        // Writing into memory does not fail; were it to, the answer goes as it was.
        let Some(compressed) = compressed else { return Response::from_parts(parts, Full::new(bytes)) };
        parts.headers.remove(hyper::header::CONTENT_LENGTH);
        parts.headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.name()));
        parts.headers.append(VARY, HeaderValue::from_static("accept-encoding"));
        Response::from_parts(parts, Full::new(Bytes::from(compressed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nesting(json: &str) -> Result<Vec<usize>, String> {
        serde_json::from_str::<JsonData>(json).unwrap().nesting.map_err(|e| e.to_string())
    }

    #[test]
    fn json_data_is_a_tensor_or_says_why_not() {
        assert_eq!(nesting("[1, 2, 3]"), Ok(vec![3]));
        assert_eq!(nesting("[[[1], [2]], [[3], [4]]]"), Ok(vec![2, 2, 1]));
        assert_eq!(nesting("[]"), Ok(vec![0]));
        assert_eq!(nesting("7"), Ok(vec![]));
        assert_eq!(nesting("[[1, 2], [3]]"), Err("is a ragged array: arrays of 2 and 1 elements at depth 2".into()));
        assert_eq!(
            nesting("[[1], [[2]]]"),
            Err("is a ragged array: numbers and arrays side by side at depth 3".into())
        );
        assert_eq!(nesting("[1, [2]]"), Err("is a ragged array: numbers and arrays side by side at depth 2".into()));
        assert_eq!(nesting("[1, false]"), Err("element 1 is a boolean (false), not a number".into()));
        assert_eq!(nesting("[[1, {\"a\": 1}]]"), Err("element 1 is an object, not a number".into()));
        let data: JsonData = serde_json::from_str("[[1, 2], [3, 4.5]]").unwrap();
        assert_eq!(data.values, vec![1.0, 2.0, 3.0, 4.5]);
        // The first problem is kept, typed: the element and the depth it was at.
        let data: JsonData = serde_json::from_str("[[1, null], [3]]").unwrap();
        assert_eq!(data.nesting, Err(NotATensor::NotANumber { index: 1, what: "null".into() }));
    }

    #[test]
    fn accept_encoding_picks_by_q_value() {
        let pick = |v: &str| {
            let mut h = hyper::HeaderMap::new();
            h.insert(hyper::header::ACCEPT_ENCODING, v.parse().unwrap());
            encoding::accepted(&h)
        };
        assert_eq!(pick("gzip"), Some(encoding::Coding::Gzip));
        assert_eq!(pick("deflate, gzip;q=0.5"), Some(encoding::Coding::Deflate));
        assert_eq!(pick("deflate;q=0.5, gzip;q=0.5"), Some(encoding::Coding::Gzip));
        assert_eq!(pick("gzip;q=0, br"), None);
        assert_eq!(pick("identity"), None);
    }
}

/// Property-based fuzzing of request parsing (JSON and binary tensors): seeds from
/// `tests/fuzz-corpus/requests/`, mutated. No body panics the parser; a body it
/// accepts is exactly the app's input.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn seeds() -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz-corpus/requests");
        let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .expect("the seed corpus")
            .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
            .collect();
        out.sort();
        assert!(out.len() >= 4, "seeds in {}", dir.display());
        out
    }

    /// Values that have broken parsers: out of every range, not numbers at all.
    const TOKENS: &[&str] = &[
        "1e39",
        "-1e400",
        "NaN",
        "Infinity",
        "18446744073709551616",
        "-0",
        "[]",
        "[[[[[[[[[[1]]]]]]]]]]",
        "null",
        "\"\\u0000\"",
        "{}",
        "1.7976931348623157e308",
        "3.4028236e38",
        "\"binary_data_size\"",
        "-1",
    ];

    /// One mutation: flip a byte, cut, splice a token in, or duplicate a span.
    fn mutate(body: &mut Vec<u8>, op: u8, at: usize, byte: u8) {
        if body.is_empty() {
            body.push(byte);
            return;
        }
        let at = at % body.len();
        match op % 4 {
            0 => body[at] ^= byte | 1,
            1 => body.truncate(at),
            2 => {
                let token = TOKENS[byte as usize % TOKENS.len()].as_bytes();
                body.splice(at..(at + 1).min(body.len()), token.iter().copied());
            }
            _ => {
                let span: Vec<u8> = body[at..].iter().take(32).copied().collect();
                body.splice(at..at, span);
            }
        }
    }

    fn parse(body: &[u8], json_len: Option<usize>) -> Result<Tensor, ApiError> {
        let spec = crate::config::InputSpec { name: "x".into(), datatype: "FP32".into(), shape: vec![4] };
        let (json, data) = binary::split(Bytes::copy_from_slice(body), json_len)?;
        let request: InferRequest = parse_json(&json)?;
        infer::to_tensor("fuzz", &spec, decode_inputs("fuzz", request.inputs, data)?, (1, "one sample"))
    }

    proptest! {
        #[test]
        fn no_body_panics_the_parser_and_what_it_accepts_is_the_input(
            seed in any::<prop::sample::Index>(),
            mutations in prop::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 0..6),
            tail in prop::collection::vec(any::<u8>(), 0..40),
            framed in any::<bool>(),
        ) {
            let seeds = seeds();
            let mut body = seeds[seed.index(seeds.len())].clone();
            for (op, at, byte) in mutations {
                mutate(&mut body, op, at, byte);
            }
            // Binary framing: the JSON header's length, then the tensor bytes.
            let json_len = framed.then_some(body.len());
            if framed {
                body.extend(&tail);
            }
            match parse(&body, json_len) {
                Ok(t) => {
                    prop_assert_eq!(&t.shape, &vec![1, 4]);
                    prop_assert_eq!(t.data.len(), 4);
                    // JSON numbers are range-checked; binary data is taken as bytes.
                    if !framed {
                        prop_assert!(t.data.first_non_finite().is_none());
                    }
                }
                Err(e) => {
                    prop_assert!(!e.message.is_empty());
                    prop_assert!(e.status.is_client_error(), "{} {}", e.status, e.message);
                }
            }
        }
    }
}
