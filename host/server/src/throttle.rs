//! Throttles for what a client or a faulting policy can repeat at line rate:
//! failed admin logins per address ([`LoginGuard`]) and warnings written at most
//! once a second ([`RateLimitedLog`]). A leaf: the fronts, the apps and the state
//! use it, and it uses none of them.

/// Failed admin logins an address may make before its admin requests are slowed.
pub const LOGIN_FAILURES_ALLOWED: u32 = 10;

/// How long an address's failed logins are remembered: its count starts over once
/// it has not failed for this long (a steady guesser stays slowed).
pub const LOGIN_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The delay an admin request from a slowed address waits per failure beyond
/// [`LOGIN_FAILURES_ALLOWED`] ...
pub const LOGIN_DELAY_STEP: std::time::Duration = std::time::Duration::from_millis(250);

/// ... up to this.
pub const LOGIN_DELAY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Addresses tracked at most (beyond it, expired entries are swept, then the
/// oldest dropped: memory stays bounded whatever the attacker's address space).
const LOGIN_TRACKED_MAX: usize = 4096;

/// Failed admin logins per client address, which slow that address's admin
/// requests without ever refusing a right token.
///
/// After [`LOGIN_FAILURES_ALLOWED`] failures (none more than [`LOGIN_WINDOW`] after
/// the one before), every admin request from the address waits [`LOGIN_DELAY_STEP`]
/// per failure beyond them, up to [`LOGIN_DELAY_MAX`], before its token is checked;
/// then a right token is served and a wrong one gets its 401. The wait applies to
/// right tokens too: were a right token answered at once, a guesser would know a
/// guess wrong as soon as no answer came, and the delay would slow nothing. So an
/// address's guesses are bounded by the connections it may hold (its share of
/// `max_connections`, [`crate::conn::Connections`]) over the delay, while an operator behind
/// the same proxy (or on localhost) as a guesser is slowed, never locked out: the
/// earlier rule (429 to every request from the address for the rest of a minute,
/// whatever the token) let anyone sharing the address lock the operator out. A
/// strong token is the defence against guessing (`admin_listen` on an internal
/// address the other); this only makes a weak one costly to guess. Failures are
/// logged at most once a second.
#[derive(Default)]
pub struct LoginGuard {
    /// Per address: when it last failed, and how many times in a row (each within
    /// [`LOGIN_WINDOW`] of the previous).
    failures: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>>,
    log: RateLimitedLog,
}

impl LoginGuard {
    /// How long an admin request from `ip` waits before its token is checked (zero
    /// while the address has failed fewer than [`LOGIN_FAILURES_ALLOWED`] times).
    pub fn delay(&self, ip: std::net::IpAddr) -> std::time::Duration {
        let map = self.failures.lock();
        match map.get(&ip) {
            Some((last, n)) if *n >= LOGIN_FAILURES_ALLOWED && last.elapsed() < LOGIN_WINDOW => {
                LOGIN_DELAY_STEP.saturating_mul(n - LOGIN_FAILURES_ALLOWED + 1).min(LOGIN_DELAY_MAX)
            }
            _ => std::time::Duration::ZERO,
        }
    }

    /// Counts a failed login from `ip`.
    pub fn failed(&self, ip: std::net::IpAddr, why: &str) {
        let now = std::time::Instant::now();
        let n = {
            let mut map = self.failures.lock();
            if map.len() >= LOGIN_TRACKED_MAX && !map.contains_key(&ip) {
                map.retain(|_, (last, _)| last.elapsed() < LOGIN_WINDOW);
                if map.len() >= LOGIN_TRACKED_MAX {
                    if let Some(oldest) = map.iter().min_by_key(|(_, (last, _))| *last).map(|(k, _)| *k) {
                        map.remove(&oldest);
                    }
                }
            }
            let entry = map.entry(ip).or_insert((now, 0));
            if entry.0.elapsed() >= LOGIN_WINDOW {
                entry.1 = 0;
            }
            *entry = (now, entry.1.saturating_add(1));
            entry.1
        };
        self.log.warn(
            |suppressed| tracing::warn!(%ip, failures = n, "failed admin login: {why} ({suppressed} more not logged)"),
        );
    }
}

/// A warning written at most once a second; the ones in between are counted and
/// the count goes with the next line written. For what an attacker or a faulting
/// policy can repeat at line rate (failed accepts, logins, policy faults).
#[derive(Default)]
pub struct RateLimitedLog {
    state: parking_lot::Mutex<(Option<std::time::Instant>, u64)>,
}

impl RateLimitedLog {
    /// Calls `log` with the number of warnings not written since the last one,
    /// unless one was written less than a second ago.
    pub fn warn(&self, log: impl FnOnce(u64)) {
        let now = std::time::Instant::now();
        let suppressed = {
            let mut state = self.state.lock();
            if state.0.is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(1)) {
                state.1 += 1;
                return;
            }
            state.0 = Some(now);
            std::mem::take(&mut state.1)
        };
        log(suppressed);
    }
}
