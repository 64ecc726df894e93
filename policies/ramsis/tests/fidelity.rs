//! The fidelity case of issue 3: the artifact's numbers for the 9 Pareto image
//! models, SLO 150 ms, K = 60, λ = 2000 QPS, FLD D = 100, N_w = 32.

mod common {
    include!("common/table.rs");
}

use common::table;
use policy_ramsis::mdp::{self, Problem};

#[test]
fn matches_the_reference_implementation() {
    let problem = Problem::new(table("image"), 150_000.0, 60, 2000.0);
    let t = std::time::Instant::now();
    let solution = mdp::generate(&problem).unwrap();
    eprintln!(
        "acc {:.6} viol {:.6} full {:.3e} states {} actions {} power {} in {:?}",
        solution.expected_accuracy,
        solution.expected_violation,
        solution.full_probability,
        solution.states,
        solution.actions,
        solution.power_iterations,
        t.elapsed()
    );
    assert!((solution.expected_accuracy - 0.74875).abs() < 0.001, "{}", solution.expected_accuracy);
    assert!((solution.expected_violation - 0.00189).abs() < 0.001, "{}", solution.expected_violation);
}
