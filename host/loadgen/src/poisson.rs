//! Open loop with Poisson arrivals, for any server that speaks HTTP/1.1: the
//! driver of the peers benchmark (`cargo xtask peers`, BENCHMARKS.md §8), which
//! sends the same body on the same arrival times to sluice, MLServer and Ray Serve.
//!
//! Start here: [`PoissonArgs`] (one run), [`run_poisson`] (sends and measures),
//! [`Record`] (what one request saw), [`arrival_times`] (the schedule, a pure
//! function of rate, duration and seed).
//!
//! Unlike [`crate::run`]'s open loop, which paces arrivals uniformly over a fixed
//! pool and *skips* an arrival when every connection is busy, this one never skips:
//! a request finds an idle keep-alive connection or opens a new one, up to
//! `max_connections` (a server that stalls would otherwise make the client, not
//! the server, decide what is dropped). It needs no sluice-specific fields: it
//! reads the status, and from a sluice answer also the server's own time for the
//! request (`parameters.latency_us`, [`Record::server_ms`]) where there is one. It
//! measures latency at the client from the scheduled send to the last body byte,
//! and records when each request actually went out ([`Record::send_ms`]), so that
//! the client's own delay can be told apart from the server's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use parking_lot::Mutex;

use crate::Client;

/// Status recorded for a request whose connection failed (refused, reset, closed).
pub const STATUS_TRANSPORT_ERROR: u16 = 0;
/// Status recorded for a request not answered within [`PoissonArgs::timeout`].
pub const STATUS_TIMEOUT: u16 = 1;
/// Status recorded for an arrival not sent because `max_connections` were all busy.
pub const STATUS_NO_CONNECTION: u16 = 2;

/// One Poisson open-loop run.
#[derive(Clone, Debug)]
pub struct PoissonArgs {
    /// Server address.
    pub addr: SocketAddr,
    /// Path to `POST`, e.g. `/v2/models/resnet50/infer`.
    pub path: String,
    /// The request body.
    pub body: Arc<Vec<u8>>,
    /// Header lines sent with it; without a `content-type` among them,
    /// `content-type: application/json` is sent (e.g. the binary tensor extension's
    /// `inference-header-content-length` with `application/octet-stream`).
    pub headers: Arc<Vec<(String, String)>>,
    /// Mean arrival rate, requests/s.
    pub rate: f64,
    /// How long arrivals are generated.
    pub duration: Duration,
    /// Seed of the arrival schedule: the same seed gives every server the same
    /// arrival times.
    pub seed: u64,
    /// A request not answered within this is recorded as [`STATUS_TIMEOUT`] and its
    /// connection dropped. It bounds the run: it ends at most this long after the
    /// last arrival, whatever backlog the server holds.
    pub timeout: Duration,
    /// Most connections open at once; an arrival beyond it is recorded as
    /// [`STATUS_NO_CONNECTION`].
    pub max_connections: usize,
}

/// What one request saw.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Record {
    /// Scheduled send time, seconds from the start of the run.
    pub at_s: f64,
    /// HTTP status, or one of the `STATUS_*` codes below 100.
    pub status: u16,
    /// From the scheduled send to the last byte of the answer (or the failure), ms.
    pub latency_ms: f64,
    /// From the scheduled send to just before the request's first byte was
    /// written, ms: the client's own delay (its timer waking late, its runtime
    /// busy, a connection to open), which the server never sees. `None` when the
    /// request was not answered (no connection, a transport error, a timeout).
    pub send_ms: Option<f64>,
    /// From the scheduled send to its last body byte handed to the kernel, ms
    /// (a large body waits for the server to read it); `None` as for `send_ms`.
    pub written_ms: Option<f64>,
    /// The server's own time for it, ms, where its answer gives one: a sluice
    /// answer's `parameters.latency_us`, from the request's head arriving to its
    /// batch's end (the server's clock, what it judges its deadline by).
    pub server_ms: Option<f64>,
    /// The part of `server_ms` before its batch started, ms (a sluice answer's
    /// `parameters.queue_us`: reading and parsing the body, then queueing).
    pub server_queue_ms: Option<f64>,
    /// The size of the batch that served it (a sluice answer's
    /// `parameters.batch_size`).
    pub server_batch: Option<u32>,
    /// A sluice answer admitted as an audit of a refusal (its
    /// `parameters.admission_audit`).
    pub audited: bool,
    /// For a sluice 429 refused as overloaded: the margin admission added to its
    /// prediction, ms (the message's "+ M ms margin for prediction errors and
    /// answering").
    pub refusal_margin_ms: Option<f64>,
}

impl Record {
    /// From just before the request was written to the last byte of its answer,
    /// ms: the server's part and the network stack's, without the client's delay
    /// in sending it (a client whose runtime stalls still reads the answer late,
    /// and that counts here).
    pub fn latency_from_send_ms(&self) -> Option<f64> {
        self.send_ms.map(|s| self.latency_ms - s)
    }

    /// A record with no send timing or server time (filled in once answered).
    fn without_timing(at_s: f64, status: u16, latency_ms: f64) -> Record {
        Record {
            at_s,
            status,
            latency_ms,
            send_ms: None,
            written_ms: None,
            server_ms: None,
            server_queue_ms: None,
            server_batch: None,
            audited: false,
            refusal_margin_ms: None,
        }
    }
}

/// The server's own account of a request, from a sluice answer's parameters
/// (every field absent in another server's answer).
#[derive(Clone, Copy, Default, serde::Deserialize)]
struct ServerTiming {
    /// Head arrival to batch end, µs.
    latency_us: Option<f64>,
    /// Head arrival to batch start, µs.
    queue_us: Option<f64>,
    batch_size: Option<u32>,
    /// Admitted as an audit of a refusal.
    admission_audit: Option<bool>,
}

#[derive(serde::Deserialize)]
struct AnswerTiming {
    parameters: Option<ServerTiming>,
}

/// The margin in a sluice overload refusal's message ("... (P ms predicted + M ms
/// margin for prediction errors and answering) ..."), ms.
fn refusal_margin_ms(body: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(body).ok()?;
    let before = &text[..text.find(" ms margin")?];
    before.rsplit(' ').next()?.parse().ok()
}

/// The server's timing in an answer's body; all `None` for another server's.
fn server_timing(body: &[u8]) -> ServerTiming {
    serde_json::from_slice::<AnswerTiming>(body).ok().and_then(|t| t.parameters).unwrap_or_default()
}

/// splitmix64: a small, seedable generator (the schedule must be reproducible, and
/// the workspace needs no `rand` for it).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so `ln` is finite.
    fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// The arrival times of a Poisson process of `rate` per second over `duration`,
/// seconds from the start: exponential gaps of mean `1 / rate` (inverse transform,
/// `−ln U / rate`).
pub fn arrival_times(rate: f64, duration: Duration, seed: u64) -> Vec<f64> {
    let mut out = Vec::new();
    if rate.is_nan() || rate <= 0.0 {
        return out;
    }
    let mut rng = SplitMix64(seed);
    let end = duration.as_secs_f64();
    let mut t = -rng.next_open01().ln() / rate;
    while t < end {
        out.push(t);
        t += -rng.next_open01().ln() / rate;
    }
    out
}

/// Sends `body` to `path` at Poisson arrival times and returns one [`Record`] per
/// arrival, in arrival order.
pub async fn run_poisson(args: PoissonArgs) -> Result<Vec<Record>> {
    let times = arrival_times(args.rate, args.duration, args.seed);
    let idle: Arc<Mutex<Vec<Client>>> = Arc::new(Mutex::new(Vec::new()));
    // Connections open or being opened; at most `max_connections`.
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let path: Arc<str> = args.path.clone().into();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut records: Vec<Option<Record>> = vec![None; times.len()];
    for (i, &at) in times.iter().enumerate() {
        let when = start + Duration::from_secs_f64(at);
        tokio::time::sleep_until(when.into()).await;
        let reused = idle.lock().pop();
        let client = match reused {
            Some(c) => Some(c),
            None if open.load(std::sync::atomic::Ordering::Relaxed) < args.max_connections => {
                open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                None
            }
            None => {
                tasks.spawn(async move { (i, Record::without_timing(at, STATUS_NO_CONNECTION, 0.0)) });
                continue;
            }
        };
        let (idle, open, path, body, addr, timeout) =
            (idle.clone(), open.clone(), path.clone(), args.body.clone(), args.addr, args.timeout);
        let headers = args.headers.clone();
        tasks.spawn(async move {
            let work = async {
                let post = |mut c: Client| {
                    let (path, body, headers) = (path.clone(), body.clone(), headers.clone());
                    async move {
                        let mut lines: Vec<(&str, &str)> =
                            headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                        if !lines.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
                            lines.push(("content-type", "application/json"));
                        }
                        let (r, sent) = c.request_timed("POST", &path, &lines, &body).await?;
                        let server = if r.status == 200 { server_timing(&r.body) } else { ServerTiming::default() };
                        let margin = if r.status == 429 { refusal_margin_ms(&r.body) } else { None };
                        Ok::<_, anyhow::Error>((c, r.status, sent, server, margin))
                    }
                };
                // A kept-alive connection the server closed while it sat idle
                // (uvicorn closes them after 5 s) is replaced by `Client::request`
                // before it sends, so the server's keep-alive timeout is not counted
                // as its error, and a request is never sent twice.
                match client {
                    Some(c) => post(c).await,
                    None => post(Client::connect(addr).await?).await,
                }
            };
            let (status, keep, timing) = match tokio::time::timeout(timeout, work).await {
                Ok(Ok((c, status, sent, server, margin))) => (status, Some(c), Some((sent, server, margin))),
                Ok(Err(_)) => (STATUS_TRANSPORT_ERROR, None, None),
                Err(_) => (STATUS_TIMEOUT, None, None),
            };
            let latency_ms = when.elapsed().as_secs_f64() * 1e3;
            let since = |t: Instant| t.saturating_duration_since(when).as_secs_f64() * 1e3;
            let mut record = Record::without_timing(at, status, latency_ms);
            if let Some((sent, server, margin)) = timing {
                record.refusal_margin_ms = margin;
                record.send_ms = Some(since(sent.started));
                record.written_ms = Some(since(sent.written));
                record.server_ms = server.latency_us.map(|us| us / 1e3);
                record.server_queue_ms = server.queue_us.map(|us| us / 1e3);
                record.server_batch = server.batch_size;
                record.audited = server.admission_audit.unwrap_or(false);
            }
            match keep {
                Some(c) => idle.lock().push(c),
                None => {
                    open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            (i, record)
        });
        // Reap finished tasks as we go, so the set holds only those in flight.
        while let Some(joined) = tasks.try_join_next() {
            let (i, r) = joined?;
            records[i] = Some(r);
        }
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, r) = joined?;
        records[i] = Some(r);
    }
    Ok(records.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_reproducible_and_has_the_rate() {
        let a = arrival_times(50.0, Duration::from_secs(200), 7);
        let b = arrival_times(50.0, Duration::from_secs(200), 7);
        assert_eq!(a, b);
        let n = a.len() as f64;
        // 10,000 expected; a Poisson count has sd 100.
        assert!((n - 10_000.0).abs() < 500.0, "{n} arrivals");
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        assert_ne!(a, arrival_times(50.0, Duration::from_secs(200), 8));
    }

    #[test]
    fn gaps_are_exponential() {
        let a = arrival_times(100.0, Duration::from_secs(100), 1);
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        // Exponential: sd equals the mean (a uniform schedule has sd 0).
        assert!((mean - 0.01).abs() < 0.0005, "mean gap {mean}");
        assert!((var.sqrt() / mean - 1.0).abs() < 0.05, "cv {}", var.sqrt() / mean);
    }

    /// Every answered request records when it went out and the server's own time
    /// from a sluice answer; from the actual send, latency still counts the
    /// server's delay.
    #[tokio::test]
    async fn records_the_send_and_the_servers_time() {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else { return };
                tokio::spawn(async move {
                    let mut s = BufReader::new(s);
                    loop {
                        let (mut line, mut len) = (String::new(), 0usize);
                        loop {
                            line.clear();
                            if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                                len = v.trim().parse().expect("length");
                            }
                            if line.trim_end().is_empty() {
                                break;
                            }
                        }
                        let mut body = vec![0; len];
                        s.read_exact(&mut body).await.expect("body");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let answer = r#"{"outputs":[],"parameters":{"variant":"a","queue_us":500,"latency_us":1500,"batch_size":2}}"#;
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", answer.len());
                        s.get_mut().write_all(format!("{head}{answer}").as_bytes()).await.expect("write");
                    }
                });
            }
        });
        let records = run_poisson(PoissonArgs {
            addr,
            path: "/v2/models/a/infer".into(),
            body: Arc::new(vec![b'x'; 100_000]),
            headers: Arc::default(),
            rate: 100.0,
            duration: Duration::from_millis(300),
            seed: 3,
            timeout: Duration::from_secs(10),
            max_connections: 16,
        })
        .await
        .expect("run");
        assert!(!records.is_empty());
        for r in &records {
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!((r.server_ms, r.server_queue_ms, r.server_batch), (Some(1.5), Some(0.5), Some(2)), "{r:?}");
            assert!(!r.audited, "{r:?}");
            let (send, written) = (r.send_ms.expect("sent"), r.written_ms.expect("written"));
            assert!(0.0 <= send && send <= written && written <= r.latency_ms, "{r:?}");
            let from_send = r.latency_from_send_ms().expect("sent");
            assert!((20.0..=r.latency_ms).contains(&from_send), "{r:?}");
        }
        assert_eq!(server_timing(br#"{"outputs":[]}"#).latency_us, None);
        assert_eq!(server_timing(br#"{"outputs":[]}"#).admission_audit, None);
        let audit = br#"{"outputs":[],"parameters":{"latency_us":9,"admission_audit":true}}"#;
        assert_eq!(server_timing(audit).admission_audit, Some(true));
        assert_eq!(server_timing(b"not json").latency_us, None);
        let refusal = br#"{"error":"app img: overloaded: behind 3 requests it would be answered in about 512 ms (431 ms predicted + 81 ms margin for prediction errors and answering), past its 400 ms deadline; retry later"}"#;
        assert_eq!(refusal_margin_ms(refusal), Some(81.0));
        assert_eq!(refusal_margin_ms(br#"{"error":"app img: queue full"}"#), None);
    }

    #[test]
    fn no_rate_no_arrivals() {
        assert!(arrival_times(0.0, Duration::from_secs(10), 1).is_empty());
    }
}
