//! A direct Monte-Carlo of one RAMSIS worker: Poisson arrivals at the central
//! queue, every K-th one routed to this worker (round-robin, §3.2.1),
//! deterministic service times from the latency table, decisions at batch
//! completions and at arrivals to an idle worker (§4.4). It checks the MDP
//! from outside: its transition frequencies against [`crate::mdp`]'s
//! probabilities, and a policy's measured accuracy and violations against its
//! expectations (§5.1, §7.3.1).

use std::collections::VecDeque;

use crate::latency;
use crate::mdp::{Action, Space};

/// SplitMix64: a small, seedable generator (policies and tests must be
/// reproducible; no external crate needed).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A uniform `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform `f64` in `(0, 1]`.
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// An exponential variate with the given rate.
    pub fn exponential(&mut self, rate: f64) -> f64 {
        -self.uniform().ln() / rate
    }
}

/// One decision seen by the simulated worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// MDP state index at the decision (`n > N_w` maps to the full-queue state).
    pub state: usize,
    /// Queue length.
    pub n: usize,
    /// Exact slack of the head, µs.
    pub slack: f64,
    /// The action taken.
    pub action: Action,
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Requests served.
    pub served: u64,
    /// Requests that finished after their deadline.
    pub late: u64,
    /// Sum of the accuracy of the requests that met their deadline.
    pub accuracy_sum: f64,
    /// Decisions taken.
    pub decisions: u64,
}

impl Report {
    /// Late fraction of served requests.
    pub fn violation(&self) -> f64 {
        self.late as f64 / self.served.max(1) as f64
    }

    /// Mean accuracy over requests that met their deadline.
    pub fn accuracy(&self) -> f64 {
        self.accuracy_sum / (self.served - self.late).max(1) as f64
    }
}

/// Simulates one of `workers` round-robin workers at central load `load_qps`
/// until `requests` requests were served. `choose(decision)` picks the action
/// (its `action` field is ignored on input); `on_transition(from, to)` sees
/// every pair of consecutive decision states.
pub fn run(
    space: &Space,
    workers: u32,
    load_qps: f64,
    requests: u64,
    seed: u64,
    mut choose: impl FnMut(&Decision) -> Action,
    mut on_transition: impl FnMut(usize, usize),
) -> Report {
    let mut rng = Rng::new(seed);
    let rate = load_qps / 1e6;
    let k = workers.max(1);
    // Worker arrivals: every K-th central arrival. Start at a random phase.
    let mut phase = (rng.next_u64() % u64::from(k)) as u32;
    let mut next_arrival = 0.0;
    let mut advance = |from: f64, rng: &mut Rng| {
        let mut t = from;
        loop {
            t += rng.exponential(rate);
            phase += 1;
            if phase >= k {
                phase = 0;
                return t;
            }
        }
    };
    next_arrival = advance(next_arrival, &mut rng);
    let mut queue: VecDeque<f64> = VecDeque::new(); // deadlines, earliest first
    let mut now = 0.0;
    let mut report = Report::default();
    let mut previous: Option<usize> = None;
    let levels = space.slack_levels();
    while report.served < requests {
        if queue.is_empty() {
            now = next_arrival;
            queue.push_back(now + space.slo);
            next_arrival = advance(next_arrival, &mut rng);
        }
        let n = queue.len();
        let slack = queue[0] - now;
        let state = if n > space.max_queue { space.full() } else { n * levels + space.quantize(slack) };
        if let Some(p) = previous {
            on_transition(p, state);
        }
        previous = Some(state);
        let decision = Decision { state, n, slack, action: Action::WAIT };
        let action = choose(&decision);
        let b = usize::from(action.batch).clamp(1, n);
        let m = usize::from(action.model);
        let tau = if b <= space.max_queue {
            space.latency(m, b)
        } else if b == space.max_queue + 1 && m == 0 {
            space.full_latency
        } else {
            latency::extrapolate(&space.latency[m], b)
        };
        let finish = now + tau;
        for _ in 0..b {
            let deadline = queue.pop_front().expect("b ≤ n");
            report.served += 1;
            if finish > deadline {
                report.late += 1;
            } else {
                report.accuracy_sum += space.accuracy[m];
            }
        }
        report.decisions += 1;
        while next_arrival < finish {
            queue.push_back(next_arrival + space.slo);
            next_arrival = advance(next_arrival, &mut rng);
        }
        now = finish;
    }
    report
}
