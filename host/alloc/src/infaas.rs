//! INFaaS-Accuracy, the most dynamic baseline of Proteus's evaluation (ASPLOS'24
//! §6.1.1): INFaaS's greedy autoscaler (INFaaS, ATC'21 §4.2.2) with accuracy and cost
//! swapped — minimise the accuracy drop with the fixed cluster as the constraint. No
//! MILP: each step looks at one app at a time and takes the cheapest local move, so
//! it can get stuck where the MILP would move devices between apps (the weakness the
//! paper names).
//!
//! One [`step`] per app, in app order, from the plan in force:
//! - **Scale up** when the app's capacity × `slack` is below its load: for every
//!   variant and device type with free devices, the devices it needs to close the
//!   gap and their cost, accuracy drop × devices (replicating the variant in use is
//!   one such option, as in the reference's `trigger_infaas_v2_upscaling`); the
//!   cheapest is added (ties: fewer devices, then the more accurate). With no free
//!   device of a usable type, the app downgrades its own devices in place to faster
//!   variants, the smallest accuracy loss first, until it copes or cannot.
//! - **Scale down** while capacity stays ample — the load at most `slack` ×
//!   `downscale` × capacity after the move (the reference's 0.95 and 1 − 0.6): upgrade
//!   a device in place to a more accurate variant, else release the least accurate
//!   device. Devices another app holds are never taken.
//! - Requests are routed in proportion to capacity (INFaaS sends each query to the
//!   least loaded worker, which this approximates).
//!
//! A device keeps its index across steps, so only devices that change are reloaded.

use crate::proteus::{allowed_variants, candidates, make_plan, Cand, DevicePlan, Plan, Problem, ProteusError, Step};

/// The autoscaler's thresholds (the reference's `infaas_slack` and
/// `infaas_downscale_slack` of its medium-load config: 0.05 and 0.6, used as 1 − x).
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Scale up when the load exceeds this fraction of capacity.
    #[serde(default = "default_slack")]
    pub slack: f64,
    /// Scale down only while the load stays under `slack × downscale` of the
    /// capacity left.
    #[serde(default = "default_downscale")]
    pub downscale: f64,
}

fn default_slack() -> f64 {
    0.95
}
fn default_downscale() -> f64 {
    0.4
}

impl Default for Settings {
    fn default() -> Self {
        Settings { slack: default_slack(), downscale: default_downscale() }
    }
}

impl Settings {
    /// Both thresholds in (0, 1].
    pub fn validate(&self) -> Result<(), ThresholdError> {
        let ok = |x: f64| x.is_finite() && x > 0.0 && x <= 1.0;
        if !ok(self.slack) || !ok(self.downscale) {
            return Err(ThresholdError { slack: self.slack, downscale: self.downscale });
        }
        Ok(())
    }
}

/// `[allocator.infaas]` with `slack` or `downscale` outside (0, 1].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("slack and downscale must be in (0, 1] (slack = {slack}, downscale = {downscale})")]
pub struct ThresholdError {
    /// `slack` as given.
    pub slack: f64,
    /// `downscale` as given.
    pub downscale: f64,
}

/// One autoscaling step for `problem`'s demand from the plan in force (None: from
/// an empty cluster). The problem's variants restriction applies; its pins and
/// ladder do not.
pub fn step(problem: &Problem, current: Option<&Plan>, settings: &Settings) -> Result<Plan, ProteusError> {
    let cands = candidates(problem)?;
    let allowed = allowed_variants(problem, &cands);
    let types: Vec<usize> =
        problem.devices.iter().enumerate().flat_map(|(t, d)| std::iter::repeat_n(t, d.count as usize)).collect();
    // What each device hosts now, as a candidate index.
    let mut assign: Vec<Option<usize>> = types
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let d = current?.devices.get(i)?;
            let (app, model) = (d.app.as_ref()?, d.model.as_ref()?);
            cands
                .iter()
                .enumerate()
                .position(|(k, c)| allowed[k] && c.t == t && &c.model == model && &problem.apps[c.q].name == app)
        })
        .collect();
    let s = Scaler { problem, cands: &cands, allowed: &allowed, types: &types, settings };
    for q in 0..problem.apps.len() {
        s.scale_app(q, &mut assign);
    }
    Ok(s.plan(&assign))
}

struct Scaler<'a> {
    problem: &'a Problem,
    cands: &'a [Cand],
    allowed: &'a [bool],
    types: &'a [usize],
    settings: &'a Settings,
}

impl Scaler<'_> {
    /// App q's usable candidates.
    fn of_app(&self, q: usize) -> impl Iterator<Item = (usize, &Cand)> {
        self.cands.iter().enumerate().filter(move |(k, c)| self.allowed[*k] && c.q == q)
    }

    /// The in-place moves open to app q: (device, its candidate, another candidate
    /// of q on the device's type), in device then candidate order.
    fn moves<'s>(&'s self, q: usize, assign: &'s [Option<usize>]) -> impl Iterator<Item = (usize, usize, usize)> + 's {
        assign
            .iter()
            .enumerate()
            .filter_map(move |(i, a)| a.filter(|&k| self.cands[k].q == q).map(|k| (i, k)))
            .flat_map(move |(i, k)| {
                self.of_app(q).filter(move |(_, c)| c.t == self.types[i]).map(move |(k2, _)| (i, k, k2))
            })
    }

    fn capacity(&self, q: usize, assign: &[Option<usize>]) -> f64 {
        assign.iter().flatten().filter(|&&k| self.cands[k].q == q).map(|&k| self.cands[k].cap.qps).sum()
    }

    fn scale_app(&self, q: usize, assign: &mut [Option<usize>]) {
        let load = self.problem.apps[q].demand_qps;
        let best = self.of_app(q).map(|(_, c)| c.accuracy).fold(f64::NEG_INFINITY, f64::max);
        let drop = |k: usize| best - self.cands[k].accuracy;
        let need = load / self.settings.slack;
        let cap = self.capacity(q, assign);
        if cap < need {
            // Free devices first; then, with none that help, downgrade in place.
            let mut guard = assign.len() * (self.cands.len() + 1) + 1;
            while self.capacity(q, assign) < need && guard > 0 {
                guard -= 1;
                let gap = need - self.capacity(q, assign);
                if self.scale_up(q, assign, gap, &drop) {
                    continue;
                }
                let mut best_move: Option<(usize, usize, f64, f64)> = None; // (device, cand, loss, gain)
                for (i, k, k2) in self.moves(q, assign) {
                    let gain = self.cands[k2].cap.qps - self.cands[k].cap.qps;
                    if gain <= 0.0 {
                        continue;
                    }
                    let loss = self.cands[k].accuracy - self.cands[k2].accuracy;
                    // Closing the gap beats not closing it; then the smaller loss; then
                    // the larger gain.
                    let key = (gain < gap, loss, -gain);
                    if best_move.is_none_or(|(_, _, l, g)| key < (g < gap, l, -g)) {
                        best_move = Some((i, k2, loss, gain));
                    }
                }
                match best_move {
                    Some((i, k2, _, _)) => assign[i] = Some(k2),
                    None => break,
                }
            }
        } else {
            self.scale_down(q, assign, load);
        }
    }

    /// Adds the cheapest set of free devices (accuracy drop × devices); false when
    /// no free device can serve the app.
    fn scale_up(&self, q: usize, assign: &mut [Option<usize>], gap: f64, drop: &dyn Fn(usize) -> f64) -> bool {
        let free = |t: usize, assign: &[Option<usize>]| {
            self.types.iter().zip(assign.iter()).filter(|(&x, a)| x == t && a.is_none()).count()
        };
        let mut choice: Option<(usize, usize, (f64, usize, f64))> = None;
        for (k, c) in self.of_app(q) {
            let available = free(c.t, assign);
            if available == 0 || c.cap.qps <= 0.0 {
                continue;
            }
            let wanted = (gap / c.cap.qps).ceil().max(1.0) as usize;
            let n = wanted.min(available);
            let key = (drop(k) * wanted as f64, wanted, -c.accuracy);
            if choice.as_ref().is_none_or(|(_, _, best)| key < *best) {
                choice = Some((k, n, key));
            }
        }
        let Some((k, mut n, _)) = choice else { return false };
        let t = self.cands[k].t;
        for (i, a) in assign.iter_mut().enumerate() {
            if n == 0 {
                break;
            }
            if self.types[i] == t && a.is_none() {
                *a = Some(k);
                n -= 1;
            }
        }
        true
    }

    /// Upgrades accuracy in place, else releases devices, while capacity stays ample.
    fn scale_down(&self, q: usize, assign: &mut [Option<usize>], load: f64) {
        let ample = |cap: f64| load <= cap * self.settings.slack * self.settings.downscale;
        let mut guard = assign.len() * (self.cands.len() + 1) + 1;
        while guard > 0 {
            guard -= 1;
            let cap = self.capacity(q, assign);
            // The largest accuracy gain that keeps capacity ample.
            let mut upgrade: Option<(usize, usize, f64)> = None;
            for (i, k, k2) in self.moves(q, assign) {
                let gain = self.cands[k2].accuracy - self.cands[k].accuracy;
                if gain > 1e-12
                    && ample(cap - self.cands[k].cap.qps + self.cands[k2].cap.qps)
                    && upgrade.is_none_or(|(_, _, g)| gain > g)
                {
                    upgrade = Some((i, k2, gain));
                }
            }
            if let Some((i, k2, _)) = upgrade {
                assign[i] = Some(k2);
                continue;
            }
            // Release the least accurate device whose capacity is not needed (the
            // app keeps at least one).
            let mine: Vec<usize> =
                (0..assign.len()).filter(|&i| assign[i].is_some_and(|k| self.cands[k].q == q)).collect();
            if mine.len() <= 1 {
                break;
            }
            let release =
                mine.iter().copied().filter(|&i| assign[i].is_some_and(|k| ample(cap - self.cands[k].cap.qps))).min_by(
                    |&a, &b| {
                        let (ka, kb) = (assign[a].unwrap_or(0), assign[b].unwrap_or(0));
                        self.cands[ka].accuracy.total_cmp(&self.cands[kb].accuracy).then(b.cmp(&a))
                    },
                );
            match release {
                Some(i) => assign[i] = None,
                None => break,
            }
        }
    }

    /// The plan: devices keep their index; each app's demand is split in proportion
    /// to its devices' capacity; what its capacity cannot carry is reported as shed.
    fn plan(&self, assign: &[Option<usize>]) -> Plan {
        let apps = self.problem.apps.len();
        let caps: Vec<f64> = (0..apps).map(|q| self.capacity(q, assign)).collect();
        let served: Vec<f64> = (0..apps).map(|q| self.problem.apps[q].demand_qps.min(caps[q])).collect();
        let mut routes: Vec<(usize, u32, f64)> = Vec::new();
        for &k in assign.iter().flatten() {
            let share = self.cands[k].cap.qps / caps[self.cands[k].q].max(1e-12);
            match routes.iter_mut().find(|r| r.0 == k) {
                Some(r) => {
                    r.1 += 1;
                    r.2 += share;
                }
                None => routes.push((k, 1, share)),
            }
        }
        routes.sort_by_key(|r| r.0);
        let mut plan = make_plan(self.problem, self.cands, &routes, 1.0, &served, Step::Heuristic);
        // make_plan numbers devices by route; keep each device where it is instead.
        let mut index = vec![0u32; self.problem.devices.len()];
        plan.devices = self
            .types
            .iter()
            .zip(assign)
            .map(|(&t, a)| {
                let dev = &self.problem.devices[t];
                let name = format!("{}-{}", dev.name, index[t]);
                index[t] += 1;
                match a {
                    Some(k) => {
                        let c = &self.cands[*k];
                        DevicePlan {
                            device: name,
                            device_type: dev.name.clone(),
                            app: Some(self.problem.apps[c.q].name.clone()),
                            model: Some(c.model.clone()),
                            share: c.cap.qps / caps[c.q].max(1e-12),
                            service_us: None,
                        }
                    }
                    None => DevicePlan {
                        device: name,
                        device_type: dev.name.clone(),
                        app: None,
                        model: None,
                        share: 0.0,
                        service_us: None,
                    },
                }
            })
            .collect();
        plan
    }
}
