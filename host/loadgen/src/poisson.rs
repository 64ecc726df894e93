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
//! the server, decide what is dropped). It reads nothing from the answers but the
//! status, so it needs no sluice-specific fields, and it measures latency at the
//! client from the scheduled send to the last body byte.

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
                tasks.spawn(async move { (i, Record { at_s: at, status: STATUS_NO_CONNECTION, latency_ms: 0.0 }) });
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
                        let r = c.request("POST", &path, &lines, &body).await?;
                        Ok::<_, anyhow::Error>((c, r.status))
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
            let (status, keep) = match tokio::time::timeout(timeout, work).await {
                Ok(Ok((c, status))) => (status, Some(c)),
                Ok(Err(_)) => (STATUS_TRANSPORT_ERROR, None),
                Err(_) => (STATUS_TIMEOUT, None),
            };
            let latency_ms = when.elapsed().as_secs_f64() * 1e3;
            match keep {
                Some(c) => idle.lock().push(c),
                None => {
                    open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            (i, Record { at_s: at, status, latency_ms })
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

    #[test]
    fn no_rate_no_arrivals() {
        assert!(arrival_times(0.0, Duration::from_secs(10), 1).is_empty());
    }
}
