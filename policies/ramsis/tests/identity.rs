//! The restructured generator against the frozen `mdp::reference`:
//! the same `Solution` (policy table, expectations, iteration counts) bit for
//! bit, the same transition rows, and the same work accounting, so that a
//! component generating slice by slice finishes on the same call.

mod common {
    include!("common/table.rs");
}

use common::table;
use policy_ramsis::mdp::{self, reference, Arrivals, Balancing, Batching, Discretization, Generator, Problem};

fn fidelity() -> Problem {
    Problem::new(table("image"), 150_000.0, 60, 2000.0)
}

/// A smaller instance for the slower variants.
fn small() -> Problem {
    let mut p = fidelity();
    p.max_queue = 12;
    p.discretization = Discretization::Fld(30);
    p
}

fn assert_same(problem: &Problem) {
    let new = mdp::generate(problem).unwrap();
    let old = reference::generate(problem).unwrap();
    // `Solution: PartialEq` compares every f64 exactly.
    assert_eq!(new, old, "{problem:?}");
    assert_eq!(new.expected_accuracy.to_bits(), old.expected_accuracy.to_bits());
    assert_eq!(new.expected_violation.to_bits(), old.expected_violation.to_bits());
    assert_eq!(new.full_probability.to_bits(), old.full_probability.to_bits());
}

#[test]
fn fidelity_case_is_identical_to_the_reference() {
    assert_same(&fidelity());
}

#[test]
fn md_and_variable_batching_are_identical_to_the_reference() {
    let mut md = fidelity();
    md.discretization = Discretization::Md;
    assert_same(&md);
    let mut variable = small();
    variable.batching = Batching::Variable;
    assert_same(&variable);
    variable.variable_exact = false;
    assert_same(&variable);
}

#[test]
fn other_balancing_arrivals_and_full_power_are_identical_to_the_reference() {
    let mut p = small();
    p.balancing = Balancing::ShortestQueue;
    assert_same(&p);
    p.balancing = Balancing::RoundRobin;
    p.arrivals = Arrivals::GammaPoisson { dispersion: 1.5 };
    assert_same(&p);
    p.arrivals = Arrivals::Poisson;
    p.stationary_tolerance = 0.0;
    p.power_iterations = 300;
    assert_same(&p);
    let mut k1 = small();
    k1.workers = 1;
    k1.load_qps = 40.0;
    assert_same(&k1);
    // A heavily loaded worker: most mass in the full-queue state.
    let mut heavy = small();
    heavy.load_qps = 20_000.0;
    assert_same(&heavy);
}

#[test]
fn parallel_generation_is_identical_to_the_reference() {
    let problem = fidelity();
    assert_eq!(mdp::generate_with_threads(&problem, 2).unwrap(), reference::generate(&problem).unwrap());
}

#[test]
fn sliced_generation_does_the_same_work_per_call() {
    for (problem, budget) in [(fidelity(), 50_000u64), (small(), 7_919)] {
        let mut new = Generator::new(&problem).unwrap();
        let mut old = reference::Generator::new(&problem).unwrap();
        let mut calls = 0u32;
        loop {
            let (a, b) = (new.step(budget), old.step(budget));
            calls += 1;
            assert_eq!(a, b, "call {calls}: done differs");
            assert_eq!(new.work(), old.work(), "call {calls}: work differs");
            assert_eq!(new.progress().to_bits(), old.progress().to_bits(), "call {calls}");
            if a {
                break;
            }
        }
        assert_eq!(new.solution(), old.solution());
        assert_eq!(new.memory_bytes() > 0, old.memory_bytes() > 0);
    }
}

#[test]
fn transition_rows_are_identical_to_the_reference() {
    let mut variable = small();
    variable.batching = Batching::Variable;
    for problem in [small(), variable] {
        let mut new = Generator::new(&problem).unwrap();
        let mut old = reference::Generator::new(&problem).unwrap();
        new.build_transitions();
        old.build_transitions();
        for s in 0..new.space().state_count() {
            assert_eq!(new.actions_of(s), old.actions_of(s));
            for a in 0..new.actions_of(s).len().max(1) {
                assert_eq!(new.transition_row(s, a), old.transition_row(s, a), "state {s} action {a}");
            }
        }
        // And after the value iteration, when the blocks may be stored differently.
        new.solve_values();
        old.solve_values();
        for s in (0..new.space().state_count()).step_by(7) {
            assert_eq!(new.transition_row(s, 0), old.transition_row(s, 0), "state {s}");
        }
    }
}
