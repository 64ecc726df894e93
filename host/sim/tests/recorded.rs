//! What the live host recorded, replayed (issue 35): an arrival log's refused
//! lines are read as refused arrivals, and a what-if replay expires requests at
//! the live host's default, not the simulator's.

// Not every fixture is used here.
#[allow(dead_code)]
mod common;

use std::sync::Arc;

use common::{experiment, PROFILE};
use sluice_core::app_config::AppConfig;
use sluice_core::whatif::{PolicyUnderTest, ReplayControl, ReplayJob};
use sluice_sim::arrivals::recorded;
use sluice_sim::{run_experiment, PolicyCache};

/// A log as `sluice serve --record-arrivals` writes it: app `a`'s five arrivals,
/// two of them refused at admission (one with spaces around its fields), and
/// another app's line between them.
const LOG: &str = "# app,arrival_us[,refused]\n\
a,1000000\n\
b,999000\n\
a,1000500,refused\n\
a,1002000\n\
a , 1001000 , refused\n\
a,1003000\n";

#[test]
fn a_recorded_log_reads_its_refused_lines_as_refused_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("arrivals.csv");
    std::fs::write(&log, LOG).unwrap();
    // µs from the app's first line (its own: `b`'s earlier line does not count),
    // each list in time order.
    let (admitted, refused) = recorded(&log, "a", u64::MAX).unwrap();
    assert_eq!(admitted, [0, 2_000, 3_000]);
    assert_eq!(refused, [500, 1_000]);
    // Only those before the duration.
    let (admitted, refused) = recorded(&log, "a", 1_000).unwrap();
    assert_eq!((admitted, refused), (vec![0], vec![500]));
    // Another app's refusals are its own.
    assert_eq!(recorded(&log, "b", u64::MAX).unwrap(), (vec![0], vec![]));
    // A third field other than `refused` is an error that names the line.
    std::fs::write(&log, "a,1000\na,2000,late\n").unwrap();
    let err = recorded(&log, "a", u64::MAX).unwrap_err().to_string();
    assert!(err.contains("line 2") && err.contains("late"), "{err}");
}

/// One worker of `fixed` on model `m` (2 in 12 ms) over the log, with the
/// simulator's admission or not.
fn replay_log(admission: bool) -> sluice_sim::stats::RunResult {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("arrivals.csv"), LOG).unwrap();
    let body = format!(
        "duration_s = 1\nadmission = {admission}\n[[app]]\nname = \"a\"\nslo_ms = 100\nworkers = 1\nprofile = \"p.toml\"\npolicy = \"fixed\"\nparams = {{ model = \"m\" }}\narrivals = {{ kind = \"recorded\", file = \"arrivals.csv\" }}\n"
    );
    let (e, base) = experiment(dir.path(), &body);
    run_experiment(&e, &base, false).unwrap().results.swap_remove(0)
}

#[test]
fn an_experiment_queues_the_admitted_arrivals_or_judges_every_one_again() {
    // Without its own admission the simulator queues what the host admitted.
    let r = replay_log(false);
    assert_eq!((r.requests, r.on_time, r.refused), (3, 3, None), "{r:?}");
    // With it, the refused lines are arrivals too, judged again: at this light
    // load none is refused.
    let r = replay_log(true);
    assert_eq!((r.requests, r.on_time, r.refused), (5, 5, Some(0)), "{r:?}");
}

/// A replay of six requests at once on one worker under the built-in `safe`
/// policy, SLO 15 ms, every arrival admitted (`admission_audit = 1`), the app's
/// `expire_after_ms` as given.
fn what_if(dir: &std::path::Path, expire_after_ms: Option<f64>) -> sluice_core::whatif::ReplayResult {
    std::fs::write(dir.join("p.toml"), PROFILE).unwrap();
    let mut app = AppConfig::new("a".into(), 15.0, 1, dir.join("p.toml"), "safe".into());
    app.expire_after_ms = expire_after_ms;
    app.admission_audit = 1.0;
    let engine = PolicyCache::new(dir.to_path_buf(), dir.to_path_buf()).unwrap().engine().clone();
    let job = ReplayJob {
        app,
        loaded: None,
        arrivals_us: Arc::new(vec![0; 6]),
        duration_us: 1,
        series_window_us: 1_000_000,
        engine,
        policy: PolicyUnderTest { name: "safe".into(), compiled: None, params: "{}".into() },
    };
    sluice_sim::whatif::replay(&job, &ReplayControl::default(), 1).unwrap()
}

#[test]
fn a_what_if_replay_expires_requests_at_the_live_default() {
    let dir = tempfile::tempdir().unwrap();
    // An idle worker decides at the first arrival's instant: `safe` serves it
    // alone at 0–10 ms (on time), then two at 10–22 ms (late: no batch meets the
    // head's deadline of 15 ms, so the largest). The last three are still queued at
    // 22 ms, past their deadline. Live, `expire_after_ms` left out is 0: they have
    // expired, dropped.
    let live = what_if(dir.path(), None);
    assert_eq!((live.requests, live.served, live.on_time, live.dropped), (6, 3, 1, 3), "{live:?}");
    // An experiment's default, one SLO (expiry at 30 ms), serves two of them late
    // at 22–34 ms and drops only the last: the replay did not use it.
    let one_slo = what_if(dir.path(), Some(15.0));
    assert_eq!((one_slo.served, one_slo.dropped), (5, 1), "{one_slo:?}");
}
