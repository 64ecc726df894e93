//! Policy tables: the `--out` JSON format and a compact binary form.
//!
//! The JSON form (`{"(n, j)": [model, batch], ..., "full": [model, batch]}`,
//! models 1-based in latency order) is what `sluice ramsis gen --out` writes and
//! what `params.policies` carries. [`Table`] parses it straight into pairs,
//! without building a `serde_json::Value` per entry: a 60-worker image grid is
//! ~140,000 entries, and parsing them through `Value`s cost 0.2 s per instance.
//!
//! The compact JSON form, which `sluice ramsis gen --load-grid --out` writes,
//! run-length encodes each queue length's row over the slack levels:
//! `{"rows": [[model, batch, count, model, batch, count, ...], ...], "full":
//! [model, batch]}`, `rows[n - 1]` for `n` queued, its runs covering slack levels
//! `0, 1, ...` in order. RAMSIS rows change action a few times each, so this is
//! ~10× smaller; every worker's instance receives the params in its own memory.
//! [`Table`] reads both forms (and a mix).
//!
//! In memory a policy is [`Runs`]: its actions run-length encoded in state
//! order, ~43 runs for the image task's 3,334 states, so the 60-worker image
//! grid (43 policies) is 16 KB in every worker's instance rather than 0.57 MB,
//! and a lookup is a binary search over the runs' ends.
//!
//! The binary form ([`encode_set`], [`decode_set`]) is how a policy set travels
//! through the binding's shared store (`sluice_sdk::shared`): loads and
//! expectations as little-endian `f64`, then the runs as they are in memory (a
//! `u32` end and two `u16` per run). Every instance of a binding after the first
//! reads the set from there in its `init`, so it is decoded at copy speed: no
//! state-by-state expansion, no per-instance table of every state to page in.

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

use crate::grid::{Entry, PolicySet};
use crate::mdp::{Action, Space};
pub use crate::runs::Runs;

/// A state key of the JSON form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableKey {
    /// `"(n, j)"`: `n` queued, slack level `j`.
    State(usize, usize),
    /// `"full"`: more queued than `N_w`.
    Full,
}

impl TableKey {
    fn parse(key: &str) -> Option<TableKey> {
        if key == "full" {
            return Some(TableKey::Full);
        }
        let inner = key.trim().strip_prefix('(')?.strip_suffix(')')?;
        let (n, j) = inner.split_once(',')?;
        Some(TableKey::State(n.trim().parse().ok()?, j.trim().parse().ok()?))
    }
}

impl fmt::Display for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableKey::State(n, j) => write!(f, "({n}, {j})"),
            TableKey::Full => f.write_str("full"),
        }
    }
}

/// A policy table in the JSON form, as `(state, [model (1-based), batch])` pairs
/// in the order they were written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table(pub Vec<(TableKey, [u64; 2])>);

impl Serialize for Table {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(&key.to_string(), value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Table {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Table, D::Error> {
        deserializer.deserialize_map(TableVisitor)
    }
}

struct TableVisitor;

impl<'de> Visitor<'de> for TableVisitor {
    type Value = Table;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a policy table {"(n, j)": [model, batch], "full": [model, batch]}"#)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Table, A::Error> {
        let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key::<KeyText<'de>>()? {
            if key.0 == "rows" {
                let rows: Vec<Vec<u64>> = map.next_value().map_err(|e| de::Error::custom(format!("`rows`: {e}")))?;
                for (i, row) in rows.iter().enumerate() {
                    let n = i + 1;
                    if row.len() % 3 != 0 {
                        return Err(de::Error::custom(format!(
                            "`rows[{i}]`: expected [model, batch, count] triples, got {} numbers",
                            row.len()
                        )));
                    }
                    let mut j = 0usize;
                    for run in row.chunks_exact(3) {
                        let count = usize::try_from(run[2]).unwrap_or(usize::MAX).min(1 << 20);
                        pairs.extend((j..j + count).map(|j| (TableKey::State(n, j), [run[0], run[1]])));
                        j += count;
                    }
                }
                continue;
            }
            let parsed =
                TableKey::parse(&key.0).ok_or_else(|| de::Error::custom(format!("bad state key `{}`", key.0)))?;
            let value: [u64; 2] = map.next_value().map_err(|e| de::Error::custom(format!("`{}`: {e}", key.0)))?;
            pairs.push((parsed, value));
        }
        Ok(Table(pairs))
    }
}

/// A map key, borrowed from the input when it has no escapes.
struct KeyText<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for KeyText<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyText<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a state key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(KeyText(v.into()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(KeyText(v.to_owned().into()))
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// A policy's actions by state, dense (`[Action]`, as the generator writes them)
/// or run-length encoded ([`Runs`]): what the table writers read.
pub trait Actions {
    /// Number of states.
    fn states(&self) -> usize;
    /// The action of state `s < states()`.
    fn action(&self, s: usize) -> Action;
}

impl Actions for [Action] {
    fn states(&self) -> usize {
        self.len()
    }
    fn action(&self, s: usize) -> Action {
        self[s]
    }
}

impl Actions for Vec<Action> {
    fn states(&self) -> usize {
        self.len()
    }
    fn action(&self, s: usize) -> Action {
        self[s]
    }
}

impl Actions for Runs {
    fn states(&self) -> usize {
        self.len()
    }
    fn action(&self, s: usize) -> Action {
        self[s]
    }
}

/// The policy as a [`Table`]: `"(n, j)"` → `[model, batch]` (model 1-based in
/// latency order), the full-queue state as `"full"`; empty queues omitted.
pub fn table_of<P: Actions + ?Sized>(space: &Space, policy: &P) -> Table {
    let mut pairs = Vec::with_capacity(policy.states());
    for s in 0..policy.states() {
        let a = policy.action(s);
        let key = if s == space.full() {
            TableKey::Full
        } else {
            let (n, j) = space.split(s);
            if n == 0 {
                continue;
            }
            TableKey::State(n, j)
        };
        pairs.push((key, [u64::from(a.model) + 1, u64::from(a.batch)]));
    }
    Table(pairs)
}

/// The policy table in the compact JSON form (see the module docs).
pub fn table_rows<P: Actions + ?Sized>(space: &Space, policy: &P) -> serde_json::Value {
    let levels = space.slack_levels();
    let rows: Vec<Vec<u64>> = (1..=space.max_queue)
        .map(|n| {
            let mut row: Vec<u64> = Vec::new();
            for j in 0..levels {
                let a = policy.action(space.state(n, j));
                let (m, b) = (u64::from(a.model) + 1, u64::from(a.batch));
                match row.len() {
                    len if len >= 3 && row[len - 3] == m && row[len - 2] == b => row[len - 1] += 1,
                    _ => row.extend([m, b, 1]),
                }
            }
            row
        })
        .collect();
    let full = policy.action(space.full());
    serde_json::json!({ "rows": rows, "full": [u64::from(full.model) + 1, u64::from(full.batch)] })
}

/// The policy table as JSON (see [`table_of`]).
pub fn table_to_json<P: Actions + ?Sized>(space: &Space, policy: &P) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(table_of(space, policy)) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => unreachable!("a table serializes to a JSON object"),
    }
}

/// The actions of `table` for `space`, checking every model, state and that
/// every non-empty state has an action.
pub fn table_actions(space: &Space, table: &Table) -> Result<Vec<Action>, String> {
    let mut policy = vec![Action::WAIT; space.state_count()];
    let models = space.models.len() as u64;
    for &(key, [model, batch]) in &table.0 {
        if model == 0 || model > models {
            return Err(format!("`{key}`: model {model} out of 1..={models}"));
        }
        let batch = u16::try_from(batch).map_err(|_| format!("`{key}`: batch {batch} too large"))?;
        let s = match key {
            TableKey::Full => space.full(),
            TableKey::State(n, j) if n <= space.max_queue && j < space.slack_levels() => space.state(n, j),
            TableKey::State(..) => return Err(format!("bad state key `{key}`")),
        };
        policy[s] = Action { model: (model - 1) as u16, batch };
    }
    // Every non-empty state needs an action (the grid and N_w must match the
    // ones the table was generated with).
    for (s, a) in policy.iter().enumerate().skip(space.slack_levels()) {
        if a.batch == 0 {
            let key = if s == space.full() {
                TableKey::Full
            } else {
                let (n, j) = space.split(s);
                TableKey::State(n, j)
            };
            return Err(format!(
                "no action for state {key}: was the table generated with this discretization and max_queue?"
            ));
        }
    }
    Ok(policy)
}

/// Appends `entry` in the binary form: load, expected accuracy and violation
/// (`f64` each), the number of runs (`u32`), then each run's end (`u32`), model
/// and batch (`u16` each), all little-endian.
pub fn encode_entry(entry: &Entry, out: &mut Vec<u8>) {
    for x in [entry.load_qps, entry.expected_accuracy, entry.expected_violation] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    let runs = &entry.policy;
    out.reserve(4 + 8 * runs.ends.len());
    out.extend_from_slice(&(runs.ends.len() as u32).to_le_bytes());
    for (end, a) in runs.ends.iter().zip(&runs.actions) {
        out.extend_from_slice(&end.to_le_bytes());
        out.extend_from_slice(&a.model.to_le_bytes());
        out.extend_from_slice(&a.batch.to_le_bytes());
    }
}

/// Reads an entry of the binary form from the front of `bytes`, advancing it;
/// `None` when it is truncated or its runs' ends do not increase.
pub fn decode_entry(bytes: &mut &[u8]) -> Option<Entry> {
    let load_qps = f64::from_le_bytes(take(bytes)?);
    let expected_accuracy = f64::from_le_bytes(take(bytes)?);
    let expected_violation = f64::from_le_bytes(take(bytes)?);
    let n = u32::from_le_bytes(take(bytes)?) as usize;
    let (body, rest) = bytes.split_at_checked(n.checked_mul(8)?)?;
    *bytes = rest;
    let mut runs = Runs { ends: Vec::with_capacity(n), actions: Vec::with_capacity(n) };
    let mut last = 0u32;
    for run in body.chunks_exact(8) {
        let end = u32::from_le_bytes([run[0], run[1], run[2], run[3]]);
        if end <= last {
            return None;
        }
        last = end;
        runs.ends.push(end);
        runs.actions
            .push(Action { model: u16::from_le_bytes([run[4], run[5]]), batch: u16::from_le_bytes([run[6], run[7]]) });
    }
    Some(Entry { load_qps, expected_accuracy, expected_violation, policy: runs })
}

/// A policy set in the binary form.
pub fn encode_set(set: &PolicySet, out: &mut Vec<u8>) {
    out.extend_from_slice(&(set.entries.len() as u32).to_le_bytes());
    for e in &set.entries {
        encode_entry(e, out);
    }
}

/// Reads a set of the binary form from the front of `bytes`, advancing it.
pub fn decode_set(bytes: &mut &[u8]) -> Option<PolicySet> {
    let n = u32::from_le_bytes(take(bytes)?);
    let mut set = PolicySet::default();
    for _ in 0..n {
        set.insert(decode_entry(bytes)?);
    }
    Some(set)
}

/// The first `N` bytes of `bytes` as an array, advancing it.
pub fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    *bytes = rest;
    Some(*head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_and_print() {
        assert_eq!(TableKey::parse("(3, 17)"), Some(TableKey::State(3, 17)));
        assert_eq!(TableKey::parse("(3,17)"), Some(TableKey::State(3, 17)));
        assert_eq!(TableKey::parse("full"), Some(TableKey::Full));
        assert_eq!(TableKey::parse("(3)"), None);
        assert_eq!(TableKey::parse("3, 17"), None);
        assert_eq!(TableKey::State(3, 17).to_string(), "(3, 17)");
    }

    #[test]
    fn tables_parse_with_clear_errors() {
        let t: Table = serde_json::from_str(r#"{"(1, 0)": [1, 1], "full": [2, 5]}"#).unwrap();
        assert_eq!(t.0, vec![(TableKey::State(1, 0), [1, 1]), (TableKey::Full, [2, 5])]);
        let back: Table = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        let e = serde_json::from_str::<Table>(r#"{"(1 0)": [1, 1]}"#).unwrap_err().to_string();
        assert!(e.contains("bad state key `(1 0)`"), "{e}");
        let e = serde_json::from_str::<Table>(r#"{"(1, 0)": [1]}"#).unwrap_err().to_string();
        assert!(e.contains("`(1, 0)`"), "{e}");
    }

    #[test]
    fn compact_rows_expand_to_states() {
        let t: Table = serde_json::from_str(r#"{"rows": [[1, 1, 2, 2, 1, 1], [1, 2, 3]], "full": [1, 4]}"#).unwrap();
        let s = |n, j| TableKey::State(n, j);
        assert_eq!(
            t.0,
            vec![
                (s(1, 0), [1, 1]),
                (s(1, 1), [1, 1]),
                (s(1, 2), [2, 1]),
                (s(2, 0), [1, 2]),
                (s(2, 1), [1, 2]),
                (s(2, 2), [1, 2]),
                (TableKey::Full, [1, 4])
            ]
        );
        let e = serde_json::from_str::<Table>(r#"{"rows": [[1, 1]]}"#).unwrap_err().to_string();
        assert!(e.contains("`rows[0]`"), "{e}");
    }

    #[test]
    fn binary_sets_round_trip_and_reject_truncation() {
        let entry = |load: f64| Entry {
            load_qps: load,
            expected_accuracy: 0.75,
            expected_violation: 1e-3,
            policy: vec![Action { model: 2, batch: 7 }, Action::WAIT].into(),
        };
        let mut set = PolicySet::default();
        set.insert(entry(200.0));
        set.insert(entry(100.0));
        let mut bytes = Vec::new();
        encode_set(&set, &mut bytes);
        let mut cursor = &bytes[..];
        assert_eq!(decode_set(&mut cursor), Some(set));
        assert!(cursor.is_empty());
        let mut short = &bytes[..bytes.len() - 1];
        assert_eq!(decode_set(&mut short), None);
    }

    #[test]
    fn runs_look_up_as_the_dense_policy_does() {
        let a = |model, batch| Action { model, batch };
        let dense = vec![Action::WAIT, Action::WAIT, a(0, 1), a(0, 1), a(0, 1), a(1, 1), a(0, 2), a(0, 2), a(3, 4)];
        let runs = Runs::new(&dense);
        assert_eq!(runs.runs(), 5, "maximal runs");
        assert_eq!(runs.len(), dense.len());
        for (s, &action) in dense.iter().enumerate() {
            assert_eq!(runs[s], action, "state {s}");
            assert_eq!(runs.get(s), Some(action));
            assert_eq!(runs.action(s), action);
        }
        assert_eq!(runs.get(dense.len()), None);
        assert_eq!(runs.to_vec(), dense);
        assert_eq!(Runs::new(&[]), Runs::default());
        assert!(Runs::new(&[]).is_empty());
        assert_eq!(Runs::new(&dense[..1]).to_vec(), vec![Action::WAIT]);
        // Runs whose ends do not increase are refused.
        let entry = Entry { load_qps: 1.0, expected_accuracy: 0.5, expected_violation: 0.0, policy: runs };
        let mut bytes = Vec::new();
        encode_entry(&entry, &mut bytes);
        assert_eq!(decode_entry(&mut &bytes[..]).as_ref(), Some(&entry));
        bytes[28..32].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode_entry(&mut &bytes[..]), None);
    }
}
