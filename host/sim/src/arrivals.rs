//! Arrival processes for the simulator: synthetic constant rate (Poisson, Gamma,
//! evenly spaced), a rate trace expanded to Poisson arrivals (the RAMSIS Twitter
//! trace), per-request traces (Proteus's `arrival_ms,qos,deadline_ms`), and arrival
//! logs recorded by the live host (`sluice serve --record-arrivals`).

use std::path::Path;

use thiserror::Error;

use sluice_core::workload::{ArrivalSpec, Spacing};

use super::rng::Rng;

/// An arrival file could not be used.
#[derive(Debug, Error)]
pub enum ArrivalError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("{file}:{line}: {message}")]
    Line {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// A parameter is out of range.
    #[error("arrivals: {0}")]
    Param(String),
}

/// One arrival: time (µs from the start) and an optional own budget (µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// When it arrives.
    pub at: u64,
    /// Its own latency budget, replacing the app's SLO (per-request traces).
    pub budget: Option<u64>,
}

/// Every arrival of `spec` in `[0, duration_us)`, in time order, drawn from `rng`
/// (the simulator's half of [`ArrivalSpec`]).
pub fn draw(
    spec: &ArrivalSpec,
    app: &str,
    base: &Path,
    duration_us: u64,
    rng: &mut Rng,
) -> Result<Vec<Arrival>, ArrivalError> {
    let check_rate = |r: f64| {
        if r.is_finite() && r > 0.0 {
            Ok(r)
        } else {
            Err(ArrivalError::Param(format!("rate_qps must be positive, got {r}")))
        }
    };
    let mut out = Vec::new();
    match spec {
        ArrivalSpec::Poisson { rate_qps } => {
            let mean = 1e6 / check_rate(*rate_qps)?;
            let mut t = 0.0;
            loop {
                t += rng.exponential(mean);
                if t >= duration_us as f64 {
                    break;
                }
                out.push(Arrival { at: t as u64, budget: None });
            }
        }
        ArrivalSpec::Gamma { rate_qps, shape } => {
            if !(shape.is_finite() && *shape > 0.0) {
                return Err(ArrivalError::Param(format!("gamma shape must be positive, got {shape}")));
            }
            let mean = 1e6 / check_rate(*rate_qps)?;
            let mut t = 0.0;
            loop {
                t += rng.gamma(*shape, mean / shape);
                if t >= duration_us as f64 {
                    break;
                }
                out.push(Arrival { at: t as u64, budget: None });
            }
        }
        ArrivalSpec::Uniform { rate_qps } => {
            let step = 1e6 / check_rate(*rate_qps)?;
            let mut i = 0u64;
            loop {
                let t = (i as f64 * step) as u64;
                if t >= duration_us {
                    break;
                }
                out.push(Arrival { at: t, budget: None });
                i += 1;
            }
        }
        ArrivalSpec::RateTrace { file, scale, spacing } => {
            let path = base.join(file);
            let steps = read_lines(&path, |line, n| {
                let mut it = line.split_whitespace();
                let parse = |x: Option<&str>| x.and_then(|v| v.parse::<f64>().ok());
                match (parse(it.next()), parse(it.next())) {
                    (Some(t), Some(q)) if t >= 0.0 && q >= 0.0 => Ok((t, q)),
                    _ => Err(format!("line {n}: expected `t_sec qps`")),
                }
            })?;
            let mut t: f64 = 0.0;
            for (i, (start, qps)) in steps.iter().enumerate() {
                let end = steps.get(i + 1).map_or(f64::INFINITY, |s| s.0) * 1e6;
                let rate = qps * scale;
                t = t.max(start * 1e6);
                if rate <= 0.0 {
                    continue;
                }
                let stop = end.min(duration_us as f64);
                match spacing {
                    Spacing::Even => {
                        let step = 1e6 / rate;
                        let mut k = 0.0;
                        while t + k * step < stop {
                            out.push(Arrival { at: (t + k * step) as u64, budget: None });
                            k += 1.0;
                        }
                    }
                    // Memorylessness: restarting the exponential clock at a rate
                    // change gives the exact piecewise-constant Poisson process.
                    Spacing::Poisson => loop {
                        let next = t + rng.exponential(1e6 / rate);
                        if next >= stop {
                            break;
                        }
                        t = next;
                        out.push(Arrival { at: t as u64, budget: None });
                    },
                }
                t = end;
                if t >= duration_us as f64 {
                    break;
                }
            }
        }
        ArrivalSpec::Requests { file } => {
            let path = base.join(file);
            let rows = read_lines(&path, |line, n| {
                let cols: Vec<&str> = line.split(',').map(str::trim).collect();
                let parse = |i: usize| cols.get(i).and_then(|v| v.parse::<f64>().ok());
                match (parse(0), parse(2)) {
                    (Some(a), Some(d)) if a >= 0.0 && d > 0.0 => Ok((a, d)),
                    _ => Err(format!("line {n}: expected `arrival_ms,qos,deadline_ms`")),
                }
            })?;
            for (a, d) in rows {
                let at = (a * 1000.0) as u64;
                if at < duration_us {
                    out.push(Arrival { at, budget: Some((d * 1000.0) as u64) });
                }
            }
            out.sort_by_key(|a| a.at);
        }
        ArrivalSpec::Recorded { file } => {
            let (admitted, _) = recorded(&base.join(file), app, duration_us)?;
            out.extend(admitted.into_iter().map(|at| Arrival { at, budget: None }));
        }
    }
    Ok(out)
}

/// App `app`'s lines of an arrival log (`sluice serve --record-arrivals`): the
/// admitted arrivals (`app,arrival_us`) and the refused ones (`app,arrival_us,refused`:
/// refused at admission), each in time order, µs from the app's first line, those
/// before `duration_us`. Without its own admission the simulator queues the
/// admitted ones and counts the refused ones in the load estimate policies see, as
/// the host did; with it (`admission = true`, what-if replays, `sluice evaluate`)
/// every one of them, refused live or not, goes through the simulated admission.
pub fn recorded(path: &Path, app: &str, duration_us: u64) -> Result<(Vec<u64>, Vec<u64>), ArrivalError> {
    let rows = read_lines(path, |line, n| {
        let mut fields = line.split(',').map(str::trim);
        let (Some(a), Some(t)) = (fields.next(), fields.next()) else {
            return Err(format!("line {n}: expected `app,arrival_us` or `app,arrival_us,refused`"));
        };
        let t: u64 = t.parse().map_err(|_| format!("line {n}: bad arrival_us"))?;
        let refused = match fields.next() {
            None => false,
            Some("refused") => true,
            Some(other) => return Err(format!("line {n}: `{other}`: expected `refused` or nothing")),
        };
        Ok((a.to_string(), t, refused))
    })?;
    let first = rows.iter().filter(|(a, ..)| a == app).map(|(_, t, _)| *t).min().unwrap_or(0);
    let (mut admitted, mut refused) = (Vec::new(), Vec::new());
    for (_, t, r) in rows.into_iter().filter(|(a, ..)| a == app) {
        let at = t - first;
        if at < duration_us {
            if r {
                refused.push(at)
            } else {
                admitted.push(at)
            }
        }
    }
    admitted.sort_unstable();
    refused.sort_unstable();
    Ok((admitted, refused))
}

fn read_lines<T>(path: &Path, mut parse: impl FnMut(&str, usize) -> Result<T, String>) -> Result<Vec<T>, ArrivalError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ArrivalError::Read { file: file.clone(), source })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse(line, i + 1).map_err(|message| ArrivalError::Line {
            file: file.clone(),
            line: i + 1,
            message,
        })?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rates_give_their_counts() {
        let mut rng = Rng::new(3);
        let p = draw(&ArrivalSpec::Poisson { rate_qps: 1000.0 }, "a", Path::new(""), 10_000_000, &mut rng).unwrap();
        assert!((p.len() as f64 - 10_000.0).abs() < 400.0, "{}", p.len());
        assert!(p.windows(2).all(|w| w[0].at <= w[1].at));
        let u = draw(&ArrivalSpec::Uniform { rate_qps: 100.0 }, "a", Path::new(""), 1_000_000, &mut rng).unwrap();
        assert_eq!(u.len(), 100);
        assert_eq!(u[1].at - u[0].at, 10_000);
        let g = draw(&ArrivalSpec::Gamma { rate_qps: 1000.0, shape: 0.05 }, "a", Path::new(""), 100_000_000, &mut rng)
            .unwrap();
        assert!((g.len() as f64 / 100_000.0 - 1.0).abs() < 0.1, "{}", g.len());
    }

    #[test]
    fn traces_are_read_and_errors_name_the_line() {
        let dir = std::env::temp_dir().join(format!("sluice-arrivals-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rate.txt"), "0 100\n1 0\n2 300\n").unwrap();
        std::fs::write(dir.join("req.txt"), "5,1,300\n1.5,1,100\n").unwrap();
        std::fs::write(dir.join("bad.txt"), "0 100\nnope\n").unwrap();
        let mut rng = Rng::new(1);
        let spec = ArrivalSpec::RateTrace { file: "rate.txt".into(), scale: 1.0, spacing: Spacing::Poisson };
        let r = draw(&spec, "a", &dir, 3_000_000, &mut rng).unwrap();
        assert!(r.iter().all(|a| a.at < 1_000_000 || a.at >= 2_000_000), "no arrivals at rate 0");
        let late = r.iter().filter(|a| a.at >= 2_000_000).count();
        assert!((200..400).contains(&late), "{late}");
        let q = draw(&ArrivalSpec::Requests { file: "req.txt".into() }, "a", &dir, 1_000_000, &mut rng).unwrap();
        assert_eq!(q, vec![Arrival { at: 1500, budget: Some(100_000) }, Arrival { at: 5000, budget: Some(300_000) }]);
        let e = draw(
            &ArrivalSpec::RateTrace { file: "bad.txt".into(), scale: 1.0, spacing: Spacing::Poisson },
            "a",
            &dir,
            1,
            &mut rng,
        )
        .unwrap_err();
        assert!(e.to_string().ends_with("bad.txt:2: line 2: expected `t_sec qps`"), "{e}");
        // Evenly spaced: exactly rate × length per step, at the step's start and
        // every 1 / rate after, none at rate 0.
        let spec = ArrivalSpec::RateTrace { file: "rate.txt".into(), scale: 0.1, spacing: Spacing::Even };
        let even: Vec<u64> = draw(&spec, "a", &dir, 3_000_000, &mut rng).unwrap().iter().map(|a| a.at).collect();
        let want: Vec<u64> =
            (0..10).map(|k| k * 100_000).chain((0..30).map(|k| 2_000_000 + k * 1_000_000 / 30)).collect();
        assert_eq!(even.len(), want.len());
        assert!(even.iter().zip(&want).all(|(a, b)| a.abs_diff(*b) <= 1), "{even:?}");
    }
}
