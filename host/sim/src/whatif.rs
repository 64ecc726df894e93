//! What-if replays: a window of arrivals the live host recorded, replayed in virtual
//! time with a policy that is not serving, through the same engine `sluice sim`
//! runs (so a replay of a recorded file gives what `sluice sim` gives on it).
//!
//! Start here: [`SimReplayer`] (the simulator behind `sluice_core::whatif::Replayer`,
//! which `sluice serve` hands the live host), [`replay`] (one policy over one
//! window), [`offline`] (`sluice evaluate`: a recorded file and a server config).
//!
//! A replay is an experiment of one app, built from the app's configuration: its
//! profile's latencies at the app's percentile (`latency = "deterministic"`), the
//! sluice accounting, queued requests finished after the last arrival (`drain`),
//! seed 1, each worker starting with the models it has loaded live, and the host's
//! admission (`admission = true`: the live host judges every client request of a
//! single app, so a candidate policy is judged on the traffic it would have
//! admitted, and every recorded arrival, those refused live included, is judged
//! again). With admission a replay runs on one thread ([`splits`]) unless its
//! admission refuses nothing (`admission_audit = 1`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use sluice_core::app_config::AppConfig;
use sluice_core::profile::Profile;
use sluice_core::whatif::{
    compare, Comparison, PolicyUnderTest, ReplayControl, ReplayError, ReplayJob, ReplayResult, Replayer,
};
use sluice_core::workload::ArrivalSpec;

use crate::arrivals::{recorded, Arrival};
use crate::engine::{RunInputs, Simulation};
use crate::{Accounting, Experiment, LatencyModel, PolicyCache, RunSpec, Sweep};

/// The simulator as the live host's [`Replayer`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SimReplayer;

impl Replayer for SimReplayer {
    fn replay(&self, job: &ReplayJob, control: &ReplayControl, threads: usize) -> Result<ReplayResult, ReplayError> {
        replay(job, control, threads)
    }

    fn splits(&self, job: &ReplayJob) -> bool {
        splits(job)
    }
}

/// The one-app experiment a replay runs (the file `sluice sim` would read, minus
/// the arrivals, which [`RunInputs`] supplies).
fn experiment(job: &ReplayJob, app: AppConfig) -> Experiment {
    Experiment {
        version: 1,
        name: "what-if".into(),
        seed: 1,
        duration_s: job.duration_us.max(1) as f64 / 1e6,
        builtin_policy_dir: PathBuf::new(),
        latency: LatencyModel::Deterministic,
        max_queue: 100_000,
        window_s: job.series_window_us.max(1) as f64 / 1e6,
        weakly_hard: None,
        finish_queues: true,
        // The live host admits every client request of a single app
        // (`sluice_server::app::App::submit`): so does its replay.
        admission: true,
        accounting: Accounting::Sluice,
        config: None,
        arrivals: BTreeMap::new(),
        apps: vec![app],
        devices: Vec::new(),
        allocator: Default::default(),
        sweep: Sweep::default(),
        system_allocators: Vec::new(),
    }
}

/// Replays `job` to the end (or until `control` is cancelled) on up to `threads`
/// threads: where the run can be split by worker ([`splits`]) each thread simulates
/// every `threads`-th worker and the shards' results are folded together, which
/// gives exactly the results of one thread (the test
/// `a_split_replay_gives_the_results_of_one_thread` checks it).
pub fn replay(job: &ReplayJob, control: &ReplayControl, threads: usize) -> Result<ReplayResult, ReplayError> {
    // Once cancelled, an error (a policy's `init` stopped by the cancel) is the
    // cancel's doing.
    let failed = |e: anyhow::Error| match control.cancelled() {
        true => ReplayError::Cancelled,
        false => ReplayError::Failed(format!("{e:#}")),
    };
    let mut cache = PolicyCache::with_engine(job.engine.clone(), PathBuf::new(), PathBuf::new());
    let (exp, run) = run_of(job, &mut cache);
    let profile_path = PathBuf::from(&run.apps[0].profile);
    let profile = Profile::load(&profile_path).map_err(|e| failed(e.into()))?;
    let profiles = BTreeMap::from([(profile_path, profile)]);
    let threads = if Simulation::shardable(&exp, &run) { threads.clamp(1, job.app.workers.max(1) as usize) } else { 1 };
    let given = |shard| RunInputs {
        arrivals: vec![Some(job.arrivals_us.iter().map(|&at| Arrival { at, budget: None }).collect())],
        loaded: vec![job.loaded.clone()],
        params: vec![Some(job.policy.params.clone())],
        shard,
        abort: Some(control.abort_flag()),
    };
    // One shard: build it, run it; false when cancelled.
    let shard = |index: usize, cache: &mut PolicyCache| -> Result<Option<Simulation>, ReplayError> {
        let shard = (threads > 1).then_some((index, threads));
        let mut sim =
            Simulation::with_inputs(&exp, Path::new(""), &run, &profiles, cache, given(shard)).map_err(failed)?;
        sim.untimed();
        Ok(sim.run_events(Some(control)).then_some(sim))
    };
    let shards: Vec<Simulation> = if threads == 1 {
        vec![shard(0, &mut cache)?.ok_or(ReplayError::Cancelled)?]
    } else {
        std::thread::scope(|s| {
            let shard = &shard;
            let others: Vec<_> = (1..threads)
                .map(|i| {
                    let mut cache = cache.clone();
                    s.spawn(move || {
                        let r = shard(i, &mut cache);
                        if !matches!(r, Ok(Some(_))) {
                            control.cancel();
                        }
                        r
                    })
                })
                .collect();
            let first = shard(0, &mut cache);
            if !matches!(first, Ok(Some(_))) {
                control.cancel();
            }
            let mut all = vec![first];
            for o in others {
                all.push(o.join().unwrap_or_else(|_| Err(ReplayError::Failed("a replay thread panicked".into()))));
            }
            // A failure says more than the cancels it caused in the other shards.
            let failed = all.iter().position(|r| matches!(r, Err(ReplayError::Failed(_))));
            match failed {
                Some(i) => Err(all.swap_remove(i).err().unwrap_or(ReplayError::Cancelled)),
                None => all.into_iter().map(|r| r?.ok_or(ReplayError::Cancelled)).collect(),
            }
        })?
    };
    if shards.len() > 1 && shards.iter().any(Simulation::shared_store_used_after_init) {
        // The instances shared work while deciding: when a value became available
        // depended on which worker did the work, so the shards' results need not be
        // the whole run's. Exact results matter more than the time: once more on one.
        return replay(job, control, 1);
    }
    let mut shards = shards.into_iter();
    let Some(mut sim) = shards.next() else { return Err(ReplayError::Cancelled) };
    for other in shards {
        sim.absorb(&other);
    }
    let (r, _, _) = sim.results().swap_remove(0);
    let (p50_ms, p99_ms, series) = sim.stats(0).replay_summary(job.series_window_us);
    Ok(ReplayResult {
        policy: job.policy.name.clone(),
        requests: r.requests,
        served: r.served,
        on_time: r.on_time,
        dropped: r.dropped,
        refused: r.refused.unwrap_or(0),
        accuracy: r.accuracy,
        violation_rate: r.violation_rate,
        p50_ms,
        p99_ms,
        faults: r.faults,
        overloaded: r.overloaded,
        series,
    })
}

/// Whether a replay of `job` can use more than one thread (see [`replay`]).
pub fn splits(job: &ReplayJob) -> bool {
    let mut cache = PolicyCache::with_engine(job.engine.clone(), PathBuf::new(), PathBuf::new());
    let (exp, run) = run_of(job, &mut cache);
    job.app.workers > 1 && Simulation::shardable(&exp, &run)
}

/// The experiment and run a replay of `job` is, with the policy put in `cache`.
fn run_of(job: &ReplayJob, cache: &mut PolicyCache) -> (Experiment, RunSpec) {
    let mut app = job.app.clone();
    // The cache is looked up by the app's `policy`: a key no file can be named.
    app.policy = match &job.policy.compiled {
        Some(c) => {
            let key = format!("what-if:{}", job.policy.name);
            cache.insert(&key, c.clone());
            key
        }
        None => sluice_core::decision::SAFE_POLICY.into(),
    };
    app.params = None;
    app.params_file = None;
    // The live host's expiry, its default included (0, where an experiment's is one
    // SLO): a replay runs the rule the host ran.
    app.expire_after_ms = Some(job.app.expire_us() as f64 / 1000.0);
    app.arrivals = Some(ArrivalSpec::Recorded { file: PathBuf::from("<recorded window>") });
    let exp = experiment(job, app.clone());
    let run = RunSpec {
        index: 0,
        policy_label: job.policy.name.clone(),
        seed: 1,
        apps: vec![app],
        allocator: exp.allocator.clone(),
    };
    (exp, run)
}

/// What `sluice evaluate` compares.
pub struct Offline<'a> {
    /// The apps of the server config.
    pub apps: &'a [AppConfig],
    /// Which app (default: the only one).
    pub app: Option<&'a str>,
    /// The arrival log (`sluice serve --record-arrivals`).
    pub recorded: &'a Path,
    /// Only the last this many seconds of the log (default: all of it).
    pub window_s: Option<f64>,
    /// The candidate: a built-in name or a `.wasm` path.
    pub candidate: &'a str,
    /// Its params, a JSON object (default `{}`).
    pub params: Option<String>,
    /// Where built-in policies are.
    pub builtin_dir: &'a Path,
    /// Width of the time series' windows, seconds.
    pub series_window_s: f64,
    /// Run the two replays on two threads.
    pub parallel: bool,
}

/// Replays a recorded file with the candidate and with the app's configured policy.
/// Returns the app's name and the comparison.
pub fn offline(o: &Offline) -> Result<(String, Comparison)> {
    let app = match o.app {
        Some(name) => o.apps.iter().find(|a| a.name == name).with_context(|| {
            let known: Vec<&str> = o.apps.iter().map(|a| a.name.as_str()).collect();
            format!("--app {name}: no such app in the config (apps: {})", known.join(", "))
        })?,
        None => match o.apps {
            [one] => one,
            _ => bail!("the config has {} apps: say which with --app", o.apps.len()),
        },
    };
    // Every arrival the host judged, those it refused included: the replay
    // judges them again with the host's admission ([`experiment`]).
    let (admitted, refused) = recorded(o.recorded, &app.name, u64::MAX)?;
    let arrivals = window(admitted.into_iter().chain(refused), o.window_s.map(|s| (s * 1e6) as u64));
    if arrivals.is_empty() {
        bail!("{}: no arrivals of app {}", o.recorded.display(), app.name);
    }
    let mut cache = PolicyCache::new(o.builtin_dir.to_path_buf(), PathBuf::new())?;
    let mut policy = |name: &str, params: String| -> Result<PolicyUnderTest> {
        let compiled = if name == sluice_core::decision::SAFE_POLICY { None } else { Some(cache.get(name)?) };
        Ok(PolicyUnderTest { name: name.to_string(), compiled, params })
    };
    let candidate = policy(o.candidate, o.params.clone().unwrap_or_else(|| "{}".into()))?;
    let current = policy(&app.policy, app.params_json(Path::new("")).with_context(|| format!("app {}", app.name))?)?;
    let job = ReplayJob {
        app: app.clone(),
        loaded: None,
        duration_us: arrivals.last().copied().unwrap_or(0) + 1,
        arrivals_us: Arc::new(arrivals),
        series_window_us: (o.series_window_s * 1e6).max(1.0) as u64,
        engine: cache.engine().clone(),
        policy: candidate,
    };
    let current_job = ReplayJob { policy: current, ..job.clone() };
    let controls = [ReplayControl::default(), ReplayControl::default()];
    let c = compare(&SimReplayer, &job, &current_job, &controls, o.parallel).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((app.name.clone(), c))
}

/// The arrivals (µs, in order) of the last `window_us` before the last one (all of
/// them without a window), from the first of them: the times a replay starts at 0.
pub fn window(times: impl Iterator<Item = u64>, window_us: Option<u64>) -> Vec<u64> {
    let mut t: Vec<u64> = times.collect();
    t.sort_unstable();
    let Some(&last) = t.last() else { return t };
    let from = window_us.map_or(0, |w| last.saturating_sub(w));
    let start = t.partition_point(|&x| x < from);
    let first = t.get(start).copied().unwrap_or(0);
    t.drain(..start);
    t.iter_mut().for_each(|x| *x -= first);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_keeps_the_last_arrivals_from_zero() {
        assert_eq!(window([30, 10, 20, 50].into_iter(), None), vec![0, 10, 20, 40]);
        assert_eq!(window([30, 10, 20, 50].into_iter(), Some(25)), vec![0, 20]);
        assert!(window(std::iter::empty(), Some(5)).is_empty());
    }
}
