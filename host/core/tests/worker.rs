//! The worker state machine (`sluice_core::worker`) with real policy components
//! (`target/policies/`, built by `cargo xtask policies`): a wait the policy asks
//! for, a decision that only dropped followed at once by another, and feedback that
//! goes only to the policy that formed the batch. The safe policy's cases are the
//! module's unit tests.

use std::path::Path;
use std::sync::Arc;

use sluice_core::decision::{Context, Queued, WorkerPolicy};
use sluice_core::queue::DropReason;
use sluice_core::runtime::{Binding, Limits, PolicyEngine, PolicyInstance};
use sluice_core::worker::{Action, Driver, Finished, Items, Machine, Report};
use sluice_sdk::{Config, Model, Pending};

const SLO: u64 = 100_000;

/// A queued request: (id, arrival); due one SLO after its arrival.
#[derive(Debug, PartialEq)]
struct R(u64, u64);

impl Queued for R {
    fn pending(&self) -> Pending {
        Pending { id: self.0, arrival: self.1, deadline: self.1 + SLO }
    }
}

/// L(b) = 20 + 5 (b − 1) ms, up to 16.
fn models() -> Vec<Model> {
    vec![Model { id: 0, name: "m".into(), accuracy: 0.8, latency: (0..16).map(|b| 20_000 + 5_000 * b).collect() }]
}

fn policy(engine: &Arc<PolicyEngine>, name: &str, params: &str) -> WorkerPolicy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/policies/{name}.wasm"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask policies`)", path.display()));
    let compiled = engine.compile(name, &bytes).expect("compile");
    let config = Config { app: "a".into(), slo: SLO, workers: 1, worker: 0, models: models(), params: params.into() };
    let binding = Binding::new(compiled, config, Limits::default());
    WorkerPolicy::Wasm(Box::new(PolicyInstance::new(engine, &binding, 0).expect("init")))
}

fn cx<'a>(now: u64, models: &'a [Model]) -> Context<'a> {
    Context {
        now,
        worker: 0,
        workers: 1,
        load_qps: 0.0,
        loaded: &[0],
        models,
        expire_us: 1_000_000,
        draining: false,
        timed: false,
    }
}

#[derive(Default)]
struct Log {
    dropped: Vec<(u64, DropReason)>,
    reports: Vec<Report>,
}

impl Driver<R> for Log {
    fn dropped(&mut self, request: R, reason: DropReason, _by_safe: bool) {
        self.dropped.push((request.0, reason));
    }
    fn decided(&mut self, _policy: &mut WorkerPolicy, report: Report) {
        self.reports.push(report);
    }
}

#[test]
fn a_wait_the_policy_asks_for_is_the_action() {
    let engine = PolicyEngine::with_cache(None).unwrap();
    // Nexus with B = 4 and two queued: its timer at 100 − L(4) = 65 ms.
    let mut nexus = policy(&engine, "nexus", r#"{"batch": 4, "margin_us": 0}"#);
    let models = models();
    let mut q = vec![R(0, 0), R(1, 5_000)];
    let mut log = Log::default();
    let turn = Machine::new().decide(&mut q, &mut nexus, &cx(10_000, &models), None, &mut log);
    assert_eq!(turn.action, Action::Wait(65_000));
    assert_eq!((q.len(), log.dropped.len(), log.reports.len()), (2, 0, 1));
    assert!(!turn.by_safe && log.reports[0].fault.is_none());
}

/// A live queue: a request arrives while the policy decides.
struct Arriving {
    queue: Vec<R>,
    looks: u32,
}

impl Items<R> for Arriving {
    fn with<T>(&mut self, f: impl FnOnce(&mut Vec<R>) -> T) -> T {
        self.looks += 1;
        if self.looks == 2 {
            self.queue.push(R(2, 120_000));
        }
        f(&mut self.queue)
    }
}

#[test]
fn a_decision_that_only_dropped_is_followed_at_once_by_another() {
    let engine = PolicyEngine::with_cache(None).unwrap();
    // Clipper's lazy drop: both queued requests are past their deadline at 150 ms,
    // so it drops them and serves nothing; the request that arrived meanwhile is
    // decided on in the same turn (a second report) and served.
    let mut clipper = policy(&engine, "clipper-aimd", "{}");
    let models = models();
    let mut q = Arriving { queue: vec![R(0, 0), R(1, 0)], looks: 0 };
    let mut log = Log::default();
    let turn = Machine::new().decide(&mut q, &mut clipper, &cx(150_000, &models), None, &mut log);
    assert_eq!(log.dropped, vec![(0, DropReason::Policy), (1, DropReason::Policy)]);
    assert_eq!(log.reports.len(), 2);
    assert_eq!(turn.action, Action::Run { model: 0, batch: vec![R(2, 120_000)] });
    assert_eq!(turn.left, 0);
}

#[test]
fn feedback_goes_only_to_the_policy_that_formed_the_batch() {
    let engine = PolicyEngine::with_cache(None).unwrap();
    // Clipper's AIMD starts at batch 1 and adds one after a batch with no miss.
    let (mut told, mut not_told) = (policy(&engine, "clipper-aimd", "{}"), policy(&engine, "clipper-aimd", "{}"));
    let batch = [R(0, 0)];
    let done = Finished::of(0, &batch, 30_000, 50_000, false);
    assert_eq!(done.observe(&batch, Some(&mut told)), Ok(true));
    // The driver says the policy that formed the batch is gone: nobody is told.
    assert_eq!(done.observe(&batch, None), Ok(false));
    let models = models();
    let sizes: Vec<usize> = [&mut told, &mut not_told]
        .into_iter()
        .map(|p| {
            let mut q: Vec<R> = (0..4).map(|i| R(i, 0)).collect();
            match Machine::new().decide(&mut q, p, &cx(0, &models), None, &mut Log::default()).action {
                Action::Run { batch, .. } => batch.len(),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(sizes, [2, 1]);
}
