//! A RAMSIS policy's actions, run-length encoded in state order ([`Runs`]): the
//! form the policy set keeps in memory and in the binding's shared bytes, apart
//! from the table formats (`table`) and the policy set (`grid`), which both use it.

use std::ops::Index;

use serde::{Deserialize, Serialize};

use crate::mdp::Action;

/// A policy's actions in state order, run-length encoded: run `r` gives
/// `actions[r]` to the states `ends[r - 1]..ends[r]` (from 0 for the first).
///
/// A RAMSIS row (one queue length over the slack levels) changes action a few
/// times (the compact JSON form's rows), so the runs are ~75× fewer than the
/// states (the image grid's policies: 3,334 states, 43 runs on average). Runs are maximal (adjacent runs differ), so two policies are equal
/// exactly when their runs are. `runs[s]` is the action of state `s`, as for a
/// dense `Vec<Action>`, found by a binary search over the ends.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runs {
    /// One past the last state of each run; increasing, the last is the state count.
    /// Crate-visible for the binary form (`table::encode_entry`, `decode_entry`).
    pub(crate) ends: Vec<u32>,
    /// The action of each run's states.
    pub(crate) actions: Vec<Action>,
}

impl Runs {
    /// The runs of a dense policy (one action per state).
    pub fn new(policy: &[Action]) -> Runs {
        let mut runs = Runs::default();
        for (s, &a) in policy.iter().enumerate() {
            match runs.actions.last() {
                Some(&last) if last == a => {}
                _ if s > 0 => {
                    runs.ends.push(s as u32);
                    runs.actions.push(a);
                }
                _ => runs.actions.push(a),
            }
        }
        if !policy.is_empty() {
            runs.ends.push(policy.len() as u32);
        }
        runs
    }

    /// Number of states.
    pub fn len(&self) -> usize {
        self.ends.last().map_or(0, |&e| e as usize)
    }

    /// Whether the policy has no state.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Number of runs.
    pub fn runs(&self) -> usize {
        self.ends.len()
    }

    /// The action of state `s`, `None` past the last state.
    pub fn get(&self, s: usize) -> Option<Action> {
        let r = self.ends.partition_point(|&e| e as usize <= s);
        self.actions.get(r).copied()
    }

    /// The dense policy, one action per state.
    pub fn to_vec(&self) -> Vec<Action> {
        let mut out = Vec::with_capacity(self.len());
        let mut start = 0usize;
        for (&end, &a) in self.ends.iter().zip(&self.actions) {
            out.extend(std::iter::repeat_n(a, end as usize - start));
            start = end as usize;
        }
        out
    }
}

impl From<Vec<Action>> for Runs {
    fn from(policy: Vec<Action>) -> Runs {
        Runs::new(&policy)
    }
}

impl Index<usize> for Runs {
    type Output = Action;

    /// The action of state `s`; panics past the last state, as a slice does.
    fn index(&self, s: usize) -> &Action {
        let r = self.ends.partition_point(|&e| e as usize <= s);
        &self.actions[r]
    }
}
