//! The differential test (issue 35): one arrival trace through the live host (its
//! worker threads, decision core and emulated executor on the wall clock) and through
//! the simulator (the same policy `.wasm`, the same decision core, virtual time), and
//! the two compared request by request: served by which variant in a batch of which
//! size, on time or late, or dropped with which reason ([`Outcome`]).
//!
//! What is exact and what is not:
//! - The requests: the simulator replays the arrivals the host recorded, at the times
//!   their deadlines run from (`--record-arrivals` records them once judged, the
//!   refused ones marked). Without its own admission it queues exactly those the host
//!   admitted (compared request by request); with it (`admission = true`, the host's
//!   code, `sluice_core::admission`) it judges every arrival again, and its refusals
//!   are compared with the host's ([`ADMISSION_TOLERANCE`]).
//! - Each outcome depends on when decisions are made. Live, a worker wakes some tens
//!   of µs after an arrival and a batch takes its profiled latency plus the
//!   executor's and the thread's overhead (tens to hundreds of µs on a busy machine);
//!   in virtual time both are exact. A request whose fate is decided within that
//!   jitter of a boundary (a burst split across two batches, a deadline met by less
//!   than the jitter) can end differently. The trace is built so that few do, and the
//!   test asks for a high agreement, not for every request.
//!
//! The pipeline half ([`compare_pipeline`]) serves a three-task tree (detect →
//! classify, detect → face) on the emulated executor in three cases
//! ([`PIPELINE_CASES`]: per-task early dropping at the hop, at batch formation as
//! well, and with a pass-through task after detect), sends a trace to it in-process,
//! replays the arrivals it sent through `sluice_sim::pipeline::replay`, and compares
//! each client request's `PipelineOutcome`: the variants that served each task and
//! how many requests each, the drops by reason, the branches served to a sink or
//! before one, and on time or not. `cargo xtask live-vs-sim` runs both halves on
//! longer traces (`LIVE_VS_SIM_REPEAT`).

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
    let mut t = Vec::new();
    for r in 0..repeat() {
        let at = r * 4_000_000;
        t.extend(app_trace().into_iter().map(|x| x + at));
    }
    t
}

/// How many times each trace repeats: 1 in the test, more under `cargo xtask
/// live-vs-sim` (`LIVE_VS_SIM_REPEAT`).
fn repeat() -> u64 {
    std::env::var("LIVE_VS_SIM_REPEAT").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1)
}

/// One round of the app trace (under 4 s).
fn app_trace() -> Vec<u64> {
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
/// compared) and collects every request's outcome in arrival order, a refusal's
/// included ([`Outcome::Refused`]).
async fn live(server: &TestServer, trace: &[u64]) -> Vec<Outcome> {
    let app = server.state.apps["emu"].clone();
    let start = tokio::time::Instant::now();
    let mut pending = Vec::new();
    for (i, &at) in trace.iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_micros(at)).await;
        pending.push(app.submit(input(i)).map_err(|e| e.refusal()));
    }
    let mut out = Vec::new();
    for p in pending {
        out.push(match p {
            Ok(rx) => Outcome::of_reply(&tokio::time::timeout(Duration::from_secs(30), rx).await.unwrap().unwrap()),
            Err(refusal) => Outcome::Refused(refusal),
        });
    }
    out
}

/// Simulated: the recorded arrivals of `log` through the simulator with the same app
/// (its policy from `dir/server.toml`), with the simulator's own admission or not.
fn simulated(dir: &std::path::Path, log: &std::path::Path, admission: bool) -> Vec<Option<Outcome>> {
    let text = format!(
        "version = 1\nname = \"live-vs-sim\"\nduration_s = 3600\nbuiltin_policy_dir = \"{}\"\nconfig = \"{}/server.toml\"\nadmission = {admission}\n[arrivals]\nemu = {{ kind = \"recorded\", file = \"{}\" }}\n",
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

/// What [`compare`] found.
struct Compared {
    /// Requests the host admitted, compared with the simulator without admission.
    admitted: usize,
    /// Of those, ending the same.
    agree: usize,
    /// Requests the host refused.
    refused: usize,
    /// Requests the simulator with admission refused, of the same arrivals.
    sim_refused: usize,
    /// Arrivals ending the same live and simulated with admission, refusals included.
    agree_all: usize,
}

/// Runs the trace both ways with `policy` (the simulator without admission and with
/// it), after printing the first differences and the summaries.
async fn compare(policy: &str, params: &str) -> Compared {
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
    let all = live(&server, &trace).await;
    // The log is flushed when the server drains.
    server.stop().await.unwrap();
    let is_refused = |o: &Outcome| matches!(o, Outcome::Refused(_));
    let live: Vec<Outcome> = all.iter().filter(|o| !is_refused(o)).cloned().collect();
    let refused = all.len() - live.len();
    let sim = simulated(mine.path(), &log, false);
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

    // Every arrival through the simulator's admission, in arrival order (the log's
    // times, in the order the host took them).
    let admitting = simulated(mine.path(), &log, true);
    assert_eq!(admitting.len(), trace.len(), "with admission every recorded arrival is judged again");
    let sim_refused = admitting.iter().flatten().filter(|o| is_refused(o)).count();
    let agree_all = all.iter().zip(&admitting).filter(|(l, s)| Some(*l) == s.as_ref()).count();
    let mut summary = std::collections::BTreeMap::<(String, String), usize>::new();
    for (l, s) in all.iter().zip(&admitting) {
        *summary.entry((label(Some(l)), label(s.as_ref()))).or_default() += 1;
    }
    eprintln!("{policy}: with admission, (live, simulated) outcomes: {summary:?}");
    eprintln!(
        "live-vs-sim admission: {policy}: refused live {refused}, simulated {sim_refused} of {}; agree {:.1} % of all arrivals",
        trace.len(),
        100.0 * agree_all as f64 / trace.len() as f64
    );
    Compared { admitted: live.len(), agree, refused, sim_refused, agree_all }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_ends_the_same_live_and_simulated() {
    for (policy, params) in [("jellyfish", "{}"), ("fixed", "{ model = \"medium\" }")] {
        let c = compare(policy, params).await;
        let (n, agree, refused) = (c.admitted, c.agree, c.refused);
        assert!(refused > 0, "{policy}: the overload phase must reach admission");
        // Every difference seen is one of the module doc's: a worker woken
        // milliseconds late on a busy machine (a batch formed from a fuller queue,
        // which then changes the next ones) or a deadline met by less than the
        // executor's overhead (`fixed` packs batches up to the head's deadline). On
        // a quiet machine jellyfish agrees on 98 %, fixed on 95 %; at a load average
        // of 9 on 2 cores, 96 % and 89 %: 85 % leaves room for a shared test machine.
        assert!(agree * 100 >= n * 85, "{policy}: {agree} of {n} requests agree");
        // The simulator admits as the host does: it refuses in the same overload,
        // about as many.
        assert!(c.sim_refused > 0, "{policy}: the simulator's admission must refuse in the overload phase");
        let off = c.sim_refused.abs_diff(refused);
        assert!(
            off as f64 <= ADMISSION_TOLERANCE * refused as f64,
            "{policy}: refused live {refused}, simulated {}",
            c.sim_refused
        );
        let total = n + refused;
        assert!(c.agree_all * 100 >= total * 85, "{policy}: {} of {total} arrivals agree with admission", c.agree_all);
    }
}

/// How far the simulator's refusals may be from the host's, as a share of the
/// host's. The two run the same admission code on the same arrivals; what differs
/// is what it learns from. Live, each answer's error against its prediction
/// includes the wall clock's jitter (a worker woken some µs to ms after the
/// arrival, the executor's overhead on each batch), so the live margins and the
/// slowdown sit a little above the simulator's, which sees exact batch times. A
/// request whose predicted finish lies within that difference of its deadline is
/// refused on one side and admitted on the other, and the queue the next arrivals
/// find then differs by one. In the overload bursts (40 at once, every 80 ms) the
/// places in the queue are a batch time apart (10 ms and more), so about one
/// request per burst is that close. Measured (2 cores, load average 3): jellyfish
/// refused 98 live and 104 simulated (6 %), fixed 154 and 147 (5 %); per arrival,
/// 96 % and 97 % end the same. 20 % and 85 % leave room for a busier machine, as
/// the admitted half's 85 % does.
const ADMISSION_TOLERANCE: f64 = 0.20;

/// The pipeline's variants, 10 × tests/pipeline.rs's latencies (µs at batch 1..=8:
/// base + per extra request), so that the wall clock's jitter is a small share of
/// every latency and budget.
fn pipeline_profile() -> String {
    let models = [
        ("d-fast", 0.70, 20_000, 4_000),
        ("d-good", 0.90, 40_000, 8_000),
        ("c-small", 0.60, 10_000, 2_000),
        ("c-big", 0.85, 31_250, 5_000),
        ("f-one", 0.80, 10_000, 2_000),
    ];
    let mut s = String::from("version = 1\nname = \"live-vs-sim\"\ndevice = \"emulated\"\nsource = \"synthetic\"\n");
    for (name, acc, base, per) in models {
        let l: Vec<String> = (0..8).map(|b| (base + per * b).to_string()).collect();
        let l = l.join(", ");
        s.push_str(&format!(
            "\n[[model]]\nname = \"{name}\"\naccuracy = {acc}\naccuracy_source = \"synthetic\"\nbatch_sizes = [1, 2, 3, 4, 5, 6, 7, 8]\np50_us = [{l}]\np95_us = [{l}]\np99_us = [{l}]\n"
        ));
    }
    s
}

/// detect → classify (2 requests per detection), detect → face (1): whole fan-outs,
/// so that both sides create the same children without a draw. With `passthrough`,
/// a pass-through task `relay` between them: detect → relay (2 per detection), relay
/// → classify and relay → face (1 each per relay request, as every pass-through).
fn pipeline_graph(prefix: &str, passthrough: bool) -> String {
    let models = |name: &str, models: &str| format!("[[{prefix}task]]\nname = \"{name}\"\nmodels = [{models}]\n");
    let edge = |from: &str, to: &str| format!("[[{prefix}edge]]\nfrom = \"{from}\"\nto = \"{to}\"\n");
    let (fanout, parent) = if passthrough {
        ("{ factor = 2.0, branch = { relay = 1.0 } }", "relay")
    } else {
        ("{ factor = 2.0, branch = { classify = 1.0, face = 0.5 } }", "detect")
    };
    let mut g = models("detect", "\"d-fast\", \"d-good\"");
    g += &format!("fanout.d-fast = {fanout}\nfanout.d-good = {fanout}\n");
    if passthrough {
        g += &format!("[[{prefix}task]]\nname = \"relay\"\n");
    }
    g += &models("classify", "\"c-small\", \"c-big\"");
    g += &models("face", "\"f-one\"");
    if passthrough {
        g += &edge("detect", "relay");
    }
    g += &edge(parent, "classify");
    g += &edge(parent, "face");
    g
}

/// One way of serving the pipeline that [`compare_pipeline`] compares.
#[derive(Clone, Copy, Debug)]
pub struct PipelineCase {
    /// The name its `live-vs-sim:` line and its messages carry (None: the first
    /// case, whose line is `live-vs-sim: pipeline …`).
    pub label: Option<&'static str>,
    /// `early_drop_at`: `hop` (on leaving a task) or `batch` (also at batch
    /// formation, the reference's `pop_while_first_expires`).
    pub early_drop_at: &'static str,
    /// Whether a pass-through task sits between detect and its children
    /// ([`pipeline_graph`]).
    pub passthrough: bool,
}

/// The cases the test and `cargo xtask live-vs-sim` run, all with per-task early
/// dropping: at the hop on the three-task tree; at batch formation as well; and at
/// the hop with a pass-through task after the root (where a request over its budget
/// at detect is dropped on entering the relay, and the relay's children carry no
/// lateness, `flow::after_passthrough`).
pub const PIPELINE_CASES: [PipelineCase; 3] = [
    PipelineCase { label: None, early_drop_at: "hop", passthrough: false },
    PipelineCase { label: Some("per-task@batch"), early_drop_at: "batch", passthrough: false },
    PipelineCase { label: Some("pass-through"), early_drop_at: "hop", passthrough: true },
];

/// SLO 400 ms on three workers (one per task: the MILP places the most accurate
/// variants, d-good, c-big and f-one, at any demand the trace makes), plans only at
/// batch [`PIPELINE_BATCH`], per-task early dropping.
const PIPELINE_SLO_MS: u64 = 400;

/// The plans' one batch size: below the tables' 8, so the cut matters. Each task
/// policy sees its variant's table cut there and its task budget (2 × the latency
/// at that batch, 40 to 160 ms) as its SLO, live as simulated (`flow::task_view`);
/// on a full table `fixed` with `allocated` would run the overload bursts in batches
/// of 8 live and of 6 simulated.
const PIPELINE_BATCH: u32 = 6;

/// The light and batch requests that open each round of [`pipeline_round`]: 8
/// alone, then 3 groups of 6. Nothing in them comes near a budget, so live and
/// simulated must agree on every one; the overload bursts after them end within
/// wall-clock jitter of their budgets.
const CALM_PER_ROUND: usize = 8 + 3 * 6;

/// Client arrivals (µs), one round under 4 s; no request reaches an idle root within
/// milliseconds of another (see [`app_trace`]):
/// - light: one every 250 ms, each served alone, its three children in one batch of
///   two and one of one;
/// - batches: every 400 ms one request, then 5 at once 6 ms later (the root busy):
///   the root serves them in one batch and the children come in batches: the 10
///   `classify` children, queued in one step, in a batch of 6 and one of 4, the
///   second done 10 ms inside its budget (6 at once made 12 children, two batches
///   of 6, the second done exactly at its budget: on time or not by the wall
///   clock's jitter);
/// - overload: twice, one request, 5 at once 6 ms later and 20 at once 50 ms
///   later (while the root serves the 5): the root serves 6 of the 20 and has no
///   time left for the rest (18 ms of slack, a batch takes 40); their 12
///   `classify` children wait behind the 5's 10 and only some make their budget.
///   Root batches overrun their budgets, and per-task early dropping drops their
///   children. (With 20 at once 6 ms after the one, the root served 6 of them
///   while `classify` was idle, and their 12 children ran in two batches of 6,
///   the second done exactly at its budget: a tie the simulator calls on time
///   and the wall clock, some µs later, late.)
fn pipeline_round() -> Vec<u64> {
    let mut t: Vec<u64> = (0..8).map(|i| i * 250_000).collect();
    for g in 0..3 {
        let at = 2_000_000 + g * 400_000;
        t.push(at);
        t.extend(std::iter::repeat_n(at + 6_000, 5));
    }
    for g in 0..2 {
        let at = 3_200_000 + g * 600_000;
        t.push(at);
        t.extend(std::iter::repeat_n(at + 6_000, 5));
        t.extend(std::iter::repeat_n(at + 50_000, 20));
    }
    t
}

fn pipeline_trace() -> Vec<u64> {
    let mut t = Vec::new();
    for r in 0..repeat() {
        let at = r * 5_000_000;
        t.extend(pipeline_round().into_iter().map(|x| x + at));
    }
    t
}

/// How many client requests a pipeline comparison saw and how many agreed, in all
/// and in the calm part of each round ([`CALM_PER_ROUND`]).
pub struct Agreement {
    /// Client requests sent.
    pub sent: usize,
    /// Of those, ending the same live and simulated.
    pub agree: usize,
    /// Client requests in the calm part of each round.
    pub calm: usize,
    /// Of those, ending the same.
    pub calm_agree: usize,
}

/// Serves the trace live (in-process, `PipelineApp::infer`) as `case` says, replays
/// the arrivals as sent through the simulator, and returns how many agree, after
/// printing the first differences and both summaries.
pub async fn compare_pipeline(case: PipelineCase) -> Agreement {
    let name = case.label.unwrap_or("pipeline");
    let PipelineCase { early_drop_at, passthrough, .. } = case;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("profile.toml"), pipeline_profile()).unwrap();
    let problem = format!(
        "version = 1\nkind = \"loki\"\nprofile = \"profile.toml\"\nbatch_sizes = [{PIPELINE_BATCH}]\nslo_ms = {PIPELINE_SLO_MS}\nworkers = 3\ndemand_qps = 10\n{}",
        pipeline_graph("pipeline.", passthrough)
    );
    std::fs::write(d.join("problem.toml"), problem).unwrap();
    let config = format!(
        "[[pipeline]]\nname = \"p\"\nproblem = \"{}/problem.toml\"\nexecutor = \"emulated\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\nearly_drop = \"per-task\"\nearly_drop_at = \"{early_drop_at}\"\nreplan_period_s = 0\nmax_queue = 10000\n",
        d.display()
    );
    let server = TestServer::start(&config).await.unwrap();
    let pipeline = server.state.pipelines["p"].clone();
    let trace = pipeline_trace();
    let start = tokio::time::Instant::now();
    let mut sent = Vec::new();
    let mut pending = Vec::new();
    for (i, &at) in trace.iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_micros(at)).await;
        sent.push(start.elapsed().as_micros() as u64);
        let p = pipeline.clone();
        let mut tree = Box::pin(async move { p.infer(input(i)).await });
        // Admitted here, in the order sent, as the simulator replays them: a client's
        // request is admitted and its root queued in `infer`'s first poll, and left to
        // a spawned task, a burst of 20 reached the root in the runtime's order (on
        // two threads, not the order sent), so the same ranks ended differently.
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(std::future::Future::poll(tree.as_mut(), cx))).await;
        pending.push(match first {
            std::task::Poll::Ready(answer) => tokio::spawn(async move { answer }),
            std::task::Poll::Pending => tokio::spawn(tree),
        });
    }
    let mut live = Vec::new();
    for h in pending {
        let answer = tokio::time::timeout(Duration::from_secs(60), h).await.unwrap().unwrap();
        live.push(answer.expect("the pipeline admits every request of the trace").outcome());
    }
    server.stop().await.unwrap();

    let log: String = sent.iter().map(|t| format!("pipeline,{t}\n")).collect();
    std::fs::write(d.join("arrivals.csv"), log).unwrap();
    let duration_s = sent.last().copied().unwrap_or(0) as f64 / 1e6 + 1.0;
    let exp = format!(
        "version = 1\nname = \"live-vs-sim-pipeline\"\nduration_s = {duration_s}\nbuiltin_policy_dir = \"{}\"\nprofile = \"profile.toml\"\n[pipeline]\nslo_ms = {PIPELINE_SLO_MS}\nworkers = 3\npercentile = \"p50\"\nbatch_sizes = [{PIPELINE_BATCH}]\narrivals = {{ kind = \"recorded\", file = \"arrivals.csv\" }}\n{}[pipeline.system]\nallocator = \"loki\"\nearly_drop = \"per-task\"\nearly_drop_at = \"{early_drop_at}\"\npolicy = \"fixed\"\nparams = {{ allocated = true }}\nsolve_interval_s = 0\nchildren = \"together\"\n",
        policies_dir().display(),
        pipeline_graph("pipeline.", passthrough)
    );
    let exp = sluice_sim::pipeline::PipelineExperiment::parse(&exp, "live-vs-sim-pipeline.toml").unwrap();
    let sim = sluice_sim::pipeline::replay(&exp, d).unwrap();
    assert_eq!(sim.len(), live.len(), "the simulator replays every request sent");

    let mut summary = std::collections::BTreeMap::<(&str, &str), usize>::new();
    let mut agree = 0;
    let (mut calm, mut calm_agree) = (0, 0);
    let round = pipeline_round().len();
    let mut shown = 0;
    for (i, (l, s)) in live.iter().zip(&sim).enumerate() {
        let is_calm = i % round < CALM_PER_ROUND;
        calm += usize::from(is_calm);
        if l == s {
            agree += 1;
            calm_agree += usize::from(is_calm);
        } else if shown < 20 {
            shown += 1;
            eprintln!("{name}: request {i} (sent at {} µs): live {l:?}, simulated {s:?}", sent[i]);
        }
        *summary.entry((l.label(), s.label())).or_default() += 1;
    }
    eprintln!("{name}: (live, simulated) outcomes: {summary:?}");
    // `cargo xtask live-vs-sim` sums every `… pipeline N requests, agree X %` line.
    let prefix = case.label.map_or(String::new(), |l| format!("{l}: "));
    eprintln!(
        "live-vs-sim: {prefix}pipeline {} requests, agree {:.1} %",
        live.len(),
        100.0 * agree as f64 / live.len() as f64
    );
    Agreement { sent: live.len(), agree, calm, calm_agree }
}

/// The cases run one after another (not as tests of their own, which `cargo test`
/// would run beside each other and beside the app's, each a source of the others'
/// wall-clock jitter); every case is run before any is judged, so a failure names
/// all that missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_through_a_pipeline_ends_the_same_live_and_simulated() {
    let mut missed = Vec::new();
    for case in PIPELINE_CASES {
        let name = case.label.unwrap_or("pipeline");
        let Agreement { sent, agree, calm, calm_agree } = compare_pipeline(case).await;
        // Away from the budgets every request ends the same; in the overload
        // bursts a batch can end within wall-clock jitter of its budget on a
        // loaded machine (the closest worked out, 2.5 ms), so early dropping drops on one side
        // only: 78 of 78 agreed in each case on 2026-11-27, the children of a
        // batch queued in one step and in its order (docs/simulator.md,
        // "Pipelines, live and simulated").
        if calm_agree != calm {
            missed.push(format!("{name}: {calm_agree} of {calm} requests away from the budgets agree"));
        }
        if agree * 100 < sent * 90 {
            missed.push(format!("{name}: {agree} of {sent} client requests agree"));
        }
    }
    assert!(missed.is_empty(), "{}", missed.join("\n"));
}
