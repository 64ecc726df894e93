//! The differential test (issue 35): one arrival trace through the live host (its
//! worker threads, decision core and emulated executor on the wall clock) and through
//! the simulator (the same policy `.wasm`, the same decision core, virtual time), and
//! the two compared request by request: served by which variant in a batch of which
//! size, on time or late, or dropped with which reason ([`Outcome`]).
//!
//! What is exact and what is not:
//! - The requests: the simulator replays the arrivals the host admitted, at the times
//!   their deadlines run from (`--record-arrivals` records them after admission). The
//!   simulator has no admission of its own; the host's refusals are counted apart.
//! - Each outcome depends on when decisions are made. Live, a worker wakes some tens
//!   of µs after an arrival and a batch takes its profiled latency plus the
//!   executor's and the thread's overhead (tens to hundreds of µs on a busy machine);
//!   in virtual time both are exact. A request whose fate is decided within that
//!   jitter of a boundary (a burst split across two batches, a deadline met by less
//!   than the jitter) can end differently. The trace is built so that few do, and the
//!   test asks for a high agreement, not for every request.

use std::time::Duration;

use sluice_core::outcome::Outcome;
use sluice_core::tensor::{Tensor, TensorData};
use sluice_e2e::*;

/// Arrival offsets (µs from the start). No request arrives at an idle worker within a
/// few ms of another: live, a woken worker decides some µs after the arrival (a few
/// ms on a machine busy compiling) and would see a different queue than the
/// simulator's, which decides at the arrival's instant. Bursts come only while both
/// workers are busy (every batch takes at least 10 ms), so the queue they find when
/// a batch finishes is the same in both.
/// - light: one request every 60 ms, each served alone;
/// - batches: every 200 ms one request, another 4 ms later, then 10 at once 4 ms
///   after that, served in batches as the workers free;
/// - overload: the same shape every 80 ms with 40 at once, more than two workers
///   serve in an SLO: admission refuses, the policy drops, the host expires.
fn trace() -> Vec<u64> {
    let mut t: Vec<u64> = (0..20).map(|i| i * 60_000).collect();
    let group = |t: &mut Vec<u64>, at: u64, burst: usize| {
        t.extend([at, at + 4_000]);
        t.extend(std::iter::repeat_n(at + 8_000, burst));
    };
    for g in 0..8 {
        group(&mut t, 1_300_000 + g * 200_000, 10);
    }
    for g in 0..8 {
        group(&mut t, 3_000_000 + g * 80_000, 40);
    }
    t
}

/// The app: two workers sharing one queue (a round-robin router would count the
/// refused requests the replay does not queue), an SLO of 200 ms, a policy in Wasm,
/// with `params`, and a fractional expiry (2.3 ms: 2,300 µs in both).
fn config(dir: &std::path::Path, policy: &str, params: &str) -> String {
    format!(
        "[[app]]\nname = \"emu\"\nexecutor = \"emulated\"\nprofile = \"{}/slow.toml\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\nslo_ms = 200\nworkers = 2\nrouter = \"shared\"\nmax_queue = 10000\nexpire_after_ms = 2.3\npolicy = \"{policy}\"\nparams = {params}\n",
        dir.display()
    )
}

fn input(i: usize) -> Tensor {
    Tensor::new("x", vec![1, 4], TensorData::F32(vec![1.0, 2.0, 3.0, i as f32])).unwrap()
}

/// Live: sends the trace to the app in-process (no HTTP: its jitter is not what is
/// compared) and collects every admitted request's outcome, in arrival order, and
/// the count of refusals.
async fn live(server: &TestServer, trace: &[u64]) -> (Vec<Outcome>, usize) {
    let app = server.state.apps["emu"].clone();
    let start = tokio::time::Instant::now();
    let mut pending = Vec::new();
    let mut refused = 0;
    for (i, &at) in trace.iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_micros(at)).await;
        match app.submit(input(i)) {
            Ok(rx) => pending.push(rx),
            Err(_) => refused += 1,
        }
    }
    let mut out = Vec::new();
    for rx in pending {
        let reply = tokio::time::timeout(Duration::from_secs(30), rx).await.unwrap().unwrap();
        out.push(Outcome::of_reply(&reply));
    }
    (out, refused)
}

/// Simulated: the recorded arrivals of `log` through the simulator with the same app
/// (its policy from `dir/server.toml`).
fn simulated(dir: &std::path::Path, log: &std::path::Path) -> Vec<Option<Outcome>> {
    let text = format!(
        "version = 1\nname = \"live-vs-sim\"\nduration_s = 3600\nbuiltin_policy_dir = \"{}\"\nconfig = \"{}/server.toml\"\n[arrivals]\nemu = {{ kind = \"recorded\", file = \"{}\" }}\n",
        policies_dir().display(),
        dir.display(),
        log.display()
    );
    let exp = sluice_sim::Experiment::parse(&text, "live-vs-sim.toml", dir).unwrap();
    let runs = exp.runs();
    let run = &runs[0];
    let profile = run.apps[0].profile.clone();
    let profiles = std::collections::BTreeMap::from([(
        dir.join(&profile),
        sluice_core::profile::Profile::load(&dir.join(&profile)).unwrap(),
    )]);
    let mut cache = sluice_sim::PolicyCache::new(policies_dir(), dir.to_path_buf()).unwrap();
    let mut sim = sluice_sim::engine::Simulation::new(&exp, dir, run, &profiles, &mut cache).unwrap();
    sim.record_outcomes();
    sim.run_events(None);
    sim.outcomes(0).unwrap().to_vec()
}

/// Runs the trace both ways with `policy`; returns (requests compared, agreeing,
/// refused live), after printing the first differences and both summaries.
async fn compare(policy: &str, params: &str) -> (usize, usize, usize) {
    let mine = tempfile::tempdir().unwrap();
    // Ten times the test profile's latencies (10–110 ms per batch): the wall clock's
    // jitter is then a small share of every latency and slack.
    std::fs::write(mine.path().join("slow.toml"), emulated_profile(10.0)).unwrap();
    let config = config(mine.path(), policy, params);
    std::fs::write(
        mine.path().join("server.toml"),
        format!("builtin_policy_dir = \"{}\"\n{config}", policies_dir().display()),
    )
    .unwrap();
    let server = TestServer::start(&config).await.unwrap();
    let log = mine.path().join("arrivals.csv");
    server.state.record_arrivals(&log).unwrap();
    let trace = trace();
    let (live, refused) = live(&server, &trace).await;
    // The log is flushed when the server drains.
    server.stop().await.unwrap();
    let sim = simulated(mine.path(), &log);
    assert_eq!(live.len() + refused, trace.len());
    assert_eq!(sim.len(), live.len(), "the simulator replays exactly the admitted requests");

    let label = |o: Option<&Outcome>| o.map_or("unfinished".to_string(), Outcome::label);
    let mut summary = std::collections::BTreeMap::<(String, String), usize>::new();
    let mut agree = 0;
    let mut shown = 0;
    for (i, (l, s)) in live.iter().zip(&sim).enumerate() {
        if Some(l) == s.as_ref() {
            agree += 1;
        } else if shown < 40 {
            shown += 1;
            eprintln!("{policy}: request {i}: live {l:?}, simulated {s:?}");
        }
        *summary.entry((label(Some(l)), label(s.as_ref()))).or_default() += 1;
    }
    eprintln!("{policy}: refused live {refused}; (live, simulated) outcomes: {summary:?}");
    eprintln!(
        "live-vs-sim: {policy}: app {} requests, agree {:.1} %",
        live.len(),
        100.0 * agree as f64 / live.len() as f64
    );
    (live.len(), agree, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_ends_the_same_live_and_simulated() {
    for (policy, params) in [("jellyfish", "{}"), ("fixed", "{ model = \"medium\" }")] {
        let (n, agree, refused) = compare(policy, params).await;
        assert!(refused > 0, "{policy}: the overload phase must reach admission");
        // Every difference seen is one of the module doc's: a worker woken
        // milliseconds late on a busy machine (a batch formed from a fuller queue,
        // which then changes the next ones) or a deadline met by less than the
        // executor's overhead (`fixed` packs batches up to the head's deadline). On
        // a quiet machine jellyfish agrees on 98 %, fixed on 95 %; at a load average
        // of 9 on 2 cores, 96 % and 89 %: 85 % leaves room for a shared test machine.
        assert!(agree * 100 >= n * 85, "{policy}: {agree} of {n} requests agree");
    }
}
