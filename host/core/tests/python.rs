//! Python policies in the runtime: components built by componentize-py (they import
//! WASI 0.2) run sandboxed with nothing granted, under the same limits as any other;
//! a Python exception is a fault whose message is the exception's; imports this
//! host does not provide are refused by name. The fixture is
//! `tests/fixtures/python/misbehave_py.py` (built by `cargo xtask policies`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::runtime::{
    self, Binding, CompiledPolicy, Limits, PolicyEngine, PolicyError, PolicyFault, PolicyInstance,
};
use sluice_sdk::{Config, Decision, Model, Pending, View};

fn target(path: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target").join(path);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask policies`)", path.display()))
}

fn compiled(engine: &Arc<PolicyEngine>) -> Arc<CompiledPolicy> {
    engine.compile("misbehave-py", &target("fixtures/misbehave-py.wasm")).expect("compile")
}

fn config(params: &str) -> Config {
    Config {
        app: "a".into(),
        slo: 10_000,
        workers: 2,
        worker: 0,
        models: vec![Model { id: 0, name: "m".into(), accuracy: 0.5, latency: vec![1_000, 1_500] }],
        params: params.into(),
    }
}

fn view() -> View {
    View {
        now: 1_000,
        worker: 0,
        workers: 2,
        load_qps: 10.0,
        loaded: vec![0],
        queue: vec![Pending { id: 1, arrival: 0, deadline: 10_000 }],
    }
}

fn instance(engine: &Arc<PolicyEngine>, mode: &str) -> Result<PolicyInstance, PolicyError> {
    limited(engine, mode, Limits::default())
}

fn limited(engine: &Arc<PolicyEngine>, mode: &str, limits: Limits) -> Result<PolicyInstance, PolicyError> {
    let binding = Binding::new(compiled(engine), config(&format!(r#"{{"mode": "{mode}"}}"#)), limits);
    PolicyInstance::new(engine, &binding, 0)
}

#[test]
fn a_python_policy_decides_and_is_linked_with_wasi() {
    let engine = PolicyEngine::new().unwrap();
    let c = compiled(&engine);
    assert!(c.wasi && !c.observes, "WASI imports and the OBSERVES = False hint are read: {c:?}");
    let mut ok = instance(&engine, "ok").unwrap();
    assert_eq!(ok.decide(&view()).unwrap(), Decision::serve_head(0, 1));
    // stdout and stderr go to the log, not to the host's own streams.
    let mut chatty = instance(&engine, "print").unwrap();
    assert_eq!(chatty.decide(&view()).unwrap(), Decision::serve_head(0, 1));
    // Rust policies keep the plain linker: no WASI state.
    let rust = engine.compile("fixed", &target("policies/fixed.wasm")).unwrap();
    assert!(!rust.wasi);
}

#[test]
fn the_sandbox_grants_nothing_and_is_deterministic() {
    let engine = PolicyEngine::new().unwrap();
    let mut a = instance(&engine, "ok").unwrap();
    let mut b = instance(&engine, "ok").unwrap();
    let sa: serde_json::Value = serde_json::from_str(&a.status().unwrap().unwrap()).unwrap();
    let sb: serde_json::Value = serde_json::from_str(&b.status().unwrap().unwrap()).unwrap();
    assert_eq!(sa["time"], serde_json::json!(0.0), "the wall clock is frozen: {sa}");
    assert_eq!(sa["monotonic"], serde_json::json!(0.0), "{sa}");
    assert_ne!(sa["files"], "readable", "no file is reachable: {sa}");
    assert_eq!(sa["env"], serde_json::json!({}), "no environment: {sa}");
    assert_eq!(sa["random"], sb["random"], "randomness is seeded the same in every instance");
    assert_eq!(sa["urandom"], sb["urandom"]);
}

#[test]
fn a_python_exception_is_a_fault_with_its_message_and_traceback() {
    let engine = PolicyEngine::new().unwrap();
    let mut i = instance(&engine, "raise").unwrap();
    let Err(PolicyFault::Trap(why)) = i.decide(&view()) else { panic!("a trap") };
    let first = why.lines().next().unwrap();
    assert_eq!(first, "Python exception KeyError: 'no such key'", "the exception is the message: {why}");
    assert!(!why.contains("panicked"), "componentize-py's own panic is left out: {why}");
    assert!(why.contains("Traceback") && why.contains("in helper"), "the traceback follows: {why}");
    assert!(!why.contains("wasm backtrace"), "not the interpreter's Wasm backtrace: {why}");
    // The instance is re-made and called again (and faults again, as asked).
    assert!(matches!(i.decide(&view()), Err(PolicyFault::Trap(_))));
    assert_eq!(i.revivals(), 1);
}

#[test]
fn init_errors_and_exceptions_refuse_the_policy_with_their_message() {
    let engine = PolicyEngine::new().unwrap();
    let err = instance(&engine, "init-error").unwrap_err().to_string();
    assert!(err.contains("init failed: misbehave: asked to fail init"), "{err}");
    let err = instance(&engine, "init-raise").unwrap_err().to_string();
    assert!(err.contains("RuntimeError: misbehave: asked to raise in init"), "{err}");
    let err = instance(&engine, "explode").unwrap_err().to_string();
    assert!(err.contains("unknown mode 'explode'"), "{err}");
}

#[test]
fn loops_and_unbounded_allocation_hit_the_limits() {
    let engine = PolicyEngine::new().unwrap();
    let mut looping = instance(&engine, "loop").unwrap();
    let started = Instant::now();
    assert_eq!(looping.decide(&view()), Err(PolicyFault::Timeout(Limits::default().call_budget)));
    assert!(started.elapsed() < Duration::from_secs(1), "stopped near its budget: {:?}", started.elapsed());
    // Zeroing tens of MB may take the interpreter longer than the default 10 ms
    // (a timeout, also a fault): with time to spare, the memory cap is what stops it.
    let limits = Limits { call_budget: Duration::from_secs(5), memory_bytes: 48 << 20, ..Limits::default() };
    let mut hoarding = limited(&engine, "alloc", limits).unwrap();
    assert_eq!(hoarding.decide(&view()), Err(PolicyFault::Memory(48 << 20)));
    // Each was re-made and the healthy one next to them never noticed.
    let mut ok = instance(&engine, "ok").unwrap();
    assert_eq!(ok.decide(&view()).unwrap(), Decision::serve_head(0, 1));
}

#[test]
fn imports_this_host_does_not_provide_are_refused_by_name() {
    let bytes = wat::parse_str(
        r#"(component
            (import "wasi:io/streams@0.2.0" (instance))
            (import "wasi:http/outgoing-handler@0.2.0" (instance))
            (import "wasi:io/poll@0.3.0" (instance))
            (import "my-own-thing" (func)))"#,
    )
    .unwrap();
    let err = runtime::check_world(&bytes).unwrap_err().to_string();
    for name in ["`wasi:http/outgoing-handler@0.2.0`", "`wasi:io/poll@0.3.0`", "`my-own-thing`"] {
        assert!(err.contains(name), "names {name}: {err}");
    }
    assert!(!err.contains("`wasi:io/streams@0.2.0`"), "provided ones are not named: {err}");
    let engine = PolicyEngine::new().unwrap();
    let refused = engine.compile("http", &bytes).unwrap_err().to_string();
    assert!(refused.contains("wasi:http/outgoing-handler@0.2.0"), "{refused}");
}

#[test]
fn the_hints_section_is_read_from_the_top_level() {
    let bytes = wat::parse_str("(component)").unwrap();
    assert!(!runtime::component_interface(&bytes).unwrap().observe_unused);
    let hinted = runtime::with_hints(&bytes, false);
    assert!(runtime::component_interface(&hinted).unwrap().observe_unused);
    assert!(!runtime::component_interface(&runtime::with_hints(&bytes, true)).unwrap().observe_unused);
}
