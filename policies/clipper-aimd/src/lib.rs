//! `clipper-aimd`: Clipper's adaptive batching by additive increase and
//! multiplicative decrease (Clipper, NSDI'17, §4.3.1; the reactive baseline of
//! Proteus, ASPLOS'24, §6.4).
//!
//! Start here: [`ClipperAimd`] (the policy), [`Params`] (its `params` JSON) and
//! [`Aimd`] (the controller, fed by `observe`).
//!
//! The worker keeps a batch-size limit. After each batch it learns (through
//! `observe`) whether any request in it missed its deadline: if none did, the
//! limit grows by one (additive increase); if some did, it is multiplied by
//! `backoff` (0.9 by default, multiplicative decrease). Service is
//! work-conserving: a free worker takes up to the limit from the head of the
//! queue at once. It is reactive — it looks neither at the queue length nor at
//! deadlines when sizing the batch — which is what Proteus contrasts it with.
//! Requests that already missed their deadline are dropped lazily.
//!
//! With `{"mode": "steps"}` the limit instead steps through the sizes
//! `{1, 2, 4, 8}` (up one step on success, down one on a miss), as the Proteus
//! simulator's "AIMD" baseline does.

use serde::Deserialize;
use sluice_sdk::{helpers, Config, Decision, Dispatch, Level, LogOnChange, Model, Outcome, Policy, View};

/// How the batch-size limit adapts.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Clipper's published rule: `+1` on success, `× backoff` on a miss.
    #[default]
    Aimd,
    /// The Proteus code's variant: step through `{1, 2, 4, 8}`.
    Steps,
}

/// The policy's parameters (all optional):
/// `{"model": "<name>", "mode": "aimd", "backoff": 0.9, "max_batch": B, "drop_late": true}`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// The variant that serves; default the most accurate loaded model whose
    /// batch-1 latency is within the SLO (else the fastest loaded one).
    pub model: Option<String>,
    /// `"aimd"` (default) or `"steps"`.
    pub mode: Mode,
    /// The multiplicative decrease factor in `(0, 1)`. Clipper uses a small
    /// back-off (10%): too small a factor collapses the batch after one miss.
    pub backoff: f64,
    /// The largest batch; default the model's profile.
    pub max_batch: Option<u32>,
    /// Drop requests whose deadline has already passed (Clipper's lazy drop).
    pub drop_late: bool,
}

impl Default for Params {
    fn default() -> Self {
        Params { model: None, mode: Mode::Aimd, backoff: 0.9, max_batch: None, drop_late: true }
    }
}

/// The sizes the `steps` mode walks through.
const STEPS: [u32; 4] = [1, 2, 4, 8];

/// The batch-size controller.
#[derive(Clone, Debug, PartialEq)]
pub struct Aimd {
    mode: Mode,
    backoff: f64,
    /// The current limit (fractional in AIMD mode so repeated back-offs compose).
    limit: f64,
    /// The index into [`STEPS`] in steps mode.
    step: usize,
}

impl Aimd {
    /// A controller starting at batch size 1.
    pub fn new(mode: Mode, backoff: f64) -> Self {
        Aimd { mode, backoff, limit: 1.0, step: 0 }
    }

    /// The current batch-size limit, within `1..=cap`.
    pub fn limit(&self, cap: u32) -> u32 {
        let raw = match self.mode {
            Mode::Aimd => self.limit.floor() as u32,
            Mode::Steps => STEPS[self.step],
        };
        raw.clamp(1, cap.max(1))
    }

    /// Learns from a finished batch: `missed` requests were late.
    pub fn observe(&mut self, missed: bool, cap: u32) {
        match (self.mode, missed) {
            (Mode::Aimd, false) => self.limit = (self.limit + 1.0).min(f64::from(cap.max(1))),
            (Mode::Aimd, true) => self.limit = (self.limit * self.backoff).max(1.0),
            (Mode::Steps, false) => {
                if self.step + 1 < STEPS.len() && STEPS[self.step + 1] <= cap {
                    self.step += 1;
                }
            }
            (Mode::Steps, true) => self.step = self.step.saturating_sub(1),
        }
    }
}

/// Clipper's AIMD batching for one worker.
#[derive(Debug)]
pub struct ClipperAimd {
    config: Config,
    params: Params,
    aimd: Aimd,
    logged: LogOnChange,
}

impl ClipperAimd {
    /// The model this worker serves with, given the loaded set.
    pub fn model<'a>(&'a self, loaded: &[u32]) -> Option<&'a Model> {
        helpers::named_or_most_accurate(&self.config, self.params.model.as_deref(), loaded)
    }

    /// The batch cap for `model`.
    fn cap(&self, model: &Model) -> u32 {
        self.params.max_batch.unwrap_or(u32::MAX).min(model.max_batch())
    }

    /// The controller's current state.
    pub fn aimd(&self) -> &Aimd {
        &self.aimd
    }
}

impl Policy for ClipperAimd {
    fn init(config: Config) -> Result<Self, String> {
        let params: Params = config.params().map_err(|e| format!("clipper-aimd: {e}"))?;
        helpers::check_model_param(&config, "clipper-aimd", params.model.as_deref())?;
        if !(params.backoff > 0.0 && params.backoff < 1.0) {
            return Err(format!("clipper-aimd: param `backoff` must be in (0, 1), got {}", params.backoff));
        }
        if params.max_batch == Some(0) {
            return Err("clipper-aimd: param `max_batch` must be at least 1".into());
        }
        let aimd = Aimd::new(params.mode, params.backoff);
        Ok(ClipperAimd { config, params, aimd, logged: LogOnChange::default() })
    }

    fn decide(&mut self, view: &View) -> Decision {
        if view.queue.is_empty() {
            return Decision::Idle;
        }
        let Some(id) = self.model(&view.loaded).map(|m| m.id) else {
            return Decision::Idle;
        };
        let model = &self.config.models[id as usize];
        let mode = self.params.mode;
        self.logged.log(id, Level::Debug, || format!("clipper-aimd: model {} ({mode:?})", model.name));
        // Lazy drop: only requests whose deadline has already passed.
        let late = if self.params.drop_late {
            view.queue.iter().take_while(|p| p.deadline <= view.now).count() as u32
        } else {
            0
        };
        let left = view.queue.len() as u32 - late;
        let batch = self.aimd.limit(self.cap(model)).min(left);
        Decision::Dispatch(Dispatch {
            model: model.id,
            take: (late..late + batch).collect(),
            drop: (0..late).collect(),
        })
    }

    fn observe(&mut self, outcome: &Outcome) {
        let cap = self.config.model(outcome.model).map_or(1, |m| self.cap(m));
        self.aimd.observe(outcome.missed > 0, cap);
    }
}

#[cfg(feature = "export")]
sluice_sdk::export_policy!(ClipperAimd);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{config, linear_model, pending, Harness};
    use sluice_sdk::{Micros, Pending};

    const SLO: Micros = 100_000;

    fn models() -> Vec<Model> {
        vec![linear_model(0, "m", 0.8, 10_000, 5_000, 16)]
    }

    fn harness(params: &str) -> Harness<ClipperAimd> {
        Harness::new(config(SLO, models(), params)).expect("init")
    }

    fn outcome(size: u32, missed: u32) -> Outcome {
        Outcome { model: 0, size, started: 0, finished: 1, missed }
    }

    fn queue(n: u64, arrival: Micros) -> Vec<Pending> {
        (0..n).map(|i| pending(i, arrival, SLO)).collect()
    }

    #[test]
    fn additive_increase_multiplicative_decrease() {
        let mut a = Aimd::new(Mode::Aimd, 0.9);
        for _ in 0..9 {
            a.observe(false, 16);
        }
        assert_eq!(a.limit(16), 10);
        a.observe(true, 16); // 10 × 0.9 = 9
        assert_eq!(a.limit(16), 9);
        a.observe(true, 16); // 8.1
        assert_eq!(a.limit(16), 8);
        a.observe(false, 16); // 9.1
        assert_eq!(a.limit(16), 9);
        for _ in 0..30 {
            a.observe(false, 16);
        }
        assert_eq!(a.limit(16), 16, "capped");
        for _ in 0..100 {
            a.observe(true, 16);
        }
        assert_eq!(a.limit(16), 1, "never below one");
    }

    #[test]
    fn steps_mode_walks_1_2_4_8() {
        let mut a = Aimd::new(Mode::Steps, 0.9);
        let mut seen = vec![a.limit(16)];
        for _ in 0..5 {
            a.observe(false, 16);
            seen.push(a.limit(16));
        }
        assert_eq!(seen, vec![1, 2, 4, 8, 8, 8]);
        a.observe(true, 16);
        assert_eq!(a.limit(16), 4);
        // A cap below the next step stops the climb.
        let mut a = Aimd::new(Mode::Steps, 0.9);
        for _ in 0..5 {
            a.observe(false, 3);
        }
        assert_eq!(a.limit(3), 2);
    }

    #[test]
    fn decide_takes_the_limit_and_drops_only_missed_requests() {
        let mut h = harness("");
        for _ in 0..3 {
            h.observe(&outcome(1, 0));
        }
        assert_eq!(h.policy().aimd().limit(16), 4);
        let v = h.view(0, 0.0, queue(6, 0));
        assert_eq!(h.decide_checked(&v), Ok(Decision::serve(0, vec![0, 1, 2, 3])));
        // Two already past their deadline (arrived at 0, now 150 ms), three fresh.
        let mut q = queue(2, 0);
        q.extend((2..5).map(|i| pending(i, 120_000, SLO)));
        let v = h.view(150_000, 0.0, q);
        let d = h.decide_checked(&v).expect("valid");
        assert_eq!(d, Decision::Dispatch(Dispatch { model: 0, take: vec![2, 3, 4], drop: vec![0, 1] }));
        // Drop-only when everything queued already missed.
        let v = h.view(150_000, 0.0, queue(2, 0));
        assert_eq!(h.decide_checked(&v), Ok(Decision::drop_only(0, vec![0, 1])));
        let mut h = harness(r#"{"drop_late": false, "mode": "steps"}"#);
        assert_eq!(h.decide_checked(&v), Ok(Decision::serve(0, vec![0])));
    }

    #[test]
    fn params_errors_name_the_parameter() {
        let err = |p: &str| Harness::<ClipperAimd>::new(config(SLO, models(), p)).unwrap_err();
        assert!(err(r#"{"backoff": 1.0}"#).contains("backoff"));
        assert!(err(r#"{"mode": "fast"}"#).contains("unknown variant"));
        assert!(err(r#"{"max_batch": 0}"#).contains("max_batch"));
        assert!(err(r#"{"model": "z"}"#).contains("`z`"));
    }

    #[test]
    fn replay_grows_the_batch_until_deadlines_are_missed() {
        // 300 req/s: batch 1 (10 ms) cannot keep up, so the limit climbs.
        let arrivals: Vec<Micros> = (0..600).map(|i| i * 3_333).collect();
        let r = harness("").replay(&arrivals, 300.0);
        assert_eq!(r.invalid, 0);
        assert_eq!(r.served + r.dropped, 600);
        assert!(r.batches.iter().any(|&(_, b)| b >= 4), "{:?}", r.batches);
    }
}
