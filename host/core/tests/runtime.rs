//! The policy runtime through a real component, the `misbehave` fixture: the shared
//! store (`shared-get` / `shared-put`: it claims the first free `slot/<k>` of its
//! binding's store in `init` and reports it from `status`), and budgets on the
//! thread's CPU clock and aborts (`{"mode": "loop"}` spins in `decide`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::runtime::{Binding, BudgetClock, CompiledPolicy, Limits, PolicyEngine, PolicyFault, PolicyInstance};
use sluice_sdk::{Config, Model, Pending, View};

fn compiled(engine: &Arc<PolicyEngine>) -> Arc<CompiledPolicy> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures/misbehave.wasm");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask policies`)", path.display()));
    engine.compile("misbehave", &bytes).expect("compile")
}

fn config(params: &str) -> Config {
    Config {
        app: "a".into(),
        slo: 10_000,
        workers: 4,
        worker: 0,
        models: vec![Model { id: 0, name: "m".into(), accuracy: 0.5, latency: vec![1_000, 1_500] }],
        params: params.into(),
    }
}

fn status(instance: &mut PolicyInstance) -> serde_json::Value {
    serde_json::from_str(&instance.status().expect("status").expect("exported")).expect("JSON")
}

#[test]
fn a_binding_shares_one_store_and_a_new_binding_starts_empty() {
    let engine = PolicyEngine::with_cache(None).unwrap();
    let policy = compiled(&engine);
    let binding = Binding::new(policy.clone(), config(r#"{"mode": "trap", "after": 1}"#), Limits::default());
    let mut instances: Vec<PolicyInstance> =
        (0..3).map(|w| PolicyInstance::new(&engine, &binding, w).expect("init")).collect();
    let slots: Vec<u64> = instances.iter_mut().map(|i| status(i)["slot"].as_u64().unwrap()).collect();
    assert_eq!(slots, [0, 1, 2]);
    // A trap poisons instance 0; its replacement belongs to the same binding.
    let view = View { now: 0, worker: 0, workers: 4, load_qps: 1.0, loaded: vec![0], queue: vec![] };
    instances[0].decide(&view).expect("behaves once");
    let view = View { queue: vec![Pending { id: 1, arrival: 0, deadline: 10_000 }], ..view };
    assert!(instances[0].decide(&view).is_err(), "traps");
    assert_eq!(status(&mut instances[0])["slot"], 3);
    // A new binding (a swap) starts with an empty store.
    let other = Binding::new(policy, config("{}"), Limits::default());
    let mut fresh = PolicyInstance::new(&engine, &other, 0).expect("init");
    assert_eq!(status(&mut fresh)["slot"], 0);
    assert!(binding.shared.get("slot/3").is_some() && other.shared.get("slot/1").is_none());
}

#[test]
fn the_store_keeps_to_its_budget() {
    let engine = PolicyEngine::with_cache(None).unwrap();
    let limits = Limits { memory_bytes: 8 << 20, ..Limits::default() };
    let binding = Binding::new(compiled(&engine), config(r#"{"mode": "flood-shared"}"#), limits);
    let mut first = PolicyInstance::new(&engine, &binding, 0).expect("init survives a refused put");
    let flooded = status(&mut first)["flooded"].as_u64().unwrap();
    assert!((1..8).contains(&flooded), "{flooded} MiB stored under an 8 MiB budget");
    assert!(binding.shared.bytes() <= 8 << 20);
    // Full: the next instance's claim and values are refused, and it still runs.
    let mut second = PolicyInstance::new(&engine, &binding, 1).expect("init");
    assert_eq!(status(&mut second)["flooded"], 0);
}

fn busy_view() -> View {
    View {
        now: 0,
        worker: 0,
        workers: 4,
        load_qps: 1.0,
        loaded: vec![0],
        queue: vec![Pending { id: 1, arrival: 0, deadline: 10_000 }],
    }
}

#[test]
fn a_cpu_budget_stops_a_loop_after_that_much_work() {
    let engine = PolicyEngine::with_cache(None).unwrap();
    let limits = Limits { call_budget: Duration::from_millis(30), ..Limits::default() }.simulated();
    assert_eq!(limits.clock, BudgetClock::ThreadCpu);
    let binding = Binding::new(compiled(&engine), config(r#"{"mode": "loop"}"#), limits);
    let mut instance = PolicyInstance::new(&engine, &binding, 0).expect("init");
    let before = thread_cpu();
    match instance.decide(&busy_view()) {
        Err(PolicyFault::Timeout(budget)) => assert_eq!(budget, Duration::from_millis(30)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The thread worked at least the budget (less at most the one tick before the
    // first look), and far less than the simulator's former one second.
    let spent = thread_cpu() - before;
    assert!(spent >= Duration::from_millis(28) && spent < Duration::from_millis(900), "{spent:?}");
    // The instance is re-made and loops again: each call is bounded the same way.
    assert!(matches!(instance.decide(&busy_view()), Err(PolicyFault::Timeout(_))));
    assert_eq!(instance.revivals(), 1);
}

/// The calling thread's CPU time, read as the runtime reads it.
fn thread_cpu() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn an_abort_stops_a_call_in_progress_and_every_later_one() {
    let engine = PolicyEngine::with_cache(None).unwrap();
    // A budget no test waits for: only the abort can stop the loop soon.
    let limits = Limits { call_budget: Duration::from_secs(600), ..Limits::default() }.simulated();
    let abort = Arc::new(AtomicBool::new(false));
    let binding =
        Binding::abortable(compiled(&engine), config(r#"{"mode": "loop"}"#), limits, None, Some(abort.clone()));
    let mut instance = PolicyInstance::new(&engine, &binding, 0).expect("init");
    let setter = {
        let abort = abort.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            abort.store(true, Ordering::Release);
        })
    };
    let started = Instant::now();
    assert!(matches!(instance.decide(&busy_view()), Err(PolicyFault::Timeout(_))));
    setter.join().unwrap();
    // Stopped by the abort (the budget is ten minutes); bounded generously for a
    // loaded machine.
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    // Later calls stop at once: the re-made instance's `init` is stopped too.
    assert!(instance.decide(&busy_view()).is_err());
}
