//! Logging through the host.

use serde::{Deserialize, Serialize};

/// Severity of a log line; the numeric values are the WIT `log` levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Level {
    /// Something is wrong and the policy cannot do what it was asked.
    Error = 0,
    /// Something is off but the policy copes (e.g. it fell back to a default).
    Warn = 1,
    /// Notable, infrequent events (a model choice changed).
    Info = 2,
    /// Detail for whoever debugs the policy.
    Debug = 3,
    /// Very verbose detail.
    Trace = 4,
}

/// Writes a line to the host's log, tagged by the host with the app, worker and
/// policy. The host rate-limits it, so do not log on every `decide`.
///
/// In a component this calls the `log` import. On the native target (unit tests,
/// [`testing::Harness`](crate::testing::Harness)) the line is appended to a
/// per-thread buffer that [`testing::take_logs`](crate::testing::take_logs)
/// drains; the buffer keeps the most recent 4,096 lines.
pub fn log(level: Level, message: &str) {
    imp::log(level, message);
}

/// Remembers the last value a policy logged about (its model choice), so a change
/// is logged once rather than on every `decide`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogOnChange(Option<u32>);

impl LogOnChange {
    /// Logs `message()` at `level` when `value` differs from the last one seen.
    pub fn log(&mut self, value: u32, level: Level, message: impl FnOnce() -> String) {
        if self.0 != Some(value) {
            self.0 = Some(value);
            log(level, &message());
        }
    }
}

/// How many lines the native log buffer keeps; older lines are discarded so a
/// long replay that logs on every decision cannot exhaust memory.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) const NATIVE_LOG_CAPACITY: usize = 4096;

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::Level;

    pub(super) fn log(level: Level, message: &str) {
        crate::wit::log(level as u8, message);
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod imp {
    use super::{Level, NATIVE_LOG_CAPACITY};
    use std::cell::RefCell;
    use std::collections::VecDeque;

    thread_local! {
        static LINES: RefCell<VecDeque<(Level, String)>> = const { RefCell::new(VecDeque::new()) };
    }

    pub(super) fn log(level: Level, message: &str) {
        LINES.with(|lines| {
            let mut lines = lines.borrow_mut();
            if lines.len() == NATIVE_LOG_CAPACITY {
                lines.pop_front();
            }
            lines.push_back((level, message.to_owned()));
        });
    }

    pub(crate) fn take() -> Vec<(Level, String)> {
        LINES.with(|lines| lines.borrow_mut().drain(..).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_on_change_logs_each_change_once() {
        let _ = imp::take();
        let mut logged = LogOnChange::default();
        for id in [1, 1, 2, 2, 1] {
            logged.log(id, Level::Debug, || format!("model {id}"));
        }
        let lines: Vec<String> = imp::take().into_iter().map(|(_, l)| l).collect();
        assert_eq!(lines, ["model 1", "model 2", "model 1"]);
    }
}
