//! Expiry in µs is one conversion, `AppConfig::expire_us_or` (issue 35): the live
//! host rounded `expire_after_ms` and the simulator truncated it, so a value whose
//! product with 1000 falls just short of an integer in f64 (2.01 ms: 2009.999…)
//! was 2,010 µs live and 2,009 µs simulated, and a request within that µs of its
//! expiry ended differently. These tests pin the conversion and that both sides
//! still call it.

use std::path::{Path, PathBuf};

use sluice_core::app_config::AppConfig;

/// An app with `expire_after_ms` set to `ms` (None: left out of the file).
fn app(ms: Option<f64>) -> AppConfig {
    let mut a = AppConfig::new("a".into(), 200.0, 1, PathBuf::from("p.toml"), "fixed".into());
    a.expire_after_ms = ms;
    a
}

#[test]
fn a_fractional_expiry_rounds_to_the_nearest_microsecond() {
    // The differential test's value (tests/live_vs_sim.rs): 2,300 µs both ways.
    assert_eq!(app(Some(2.3)).expire_us(), 2_300);
    // The simulator passes its own default (one SLO); a set value ignores it.
    assert_eq!(app(Some(2.3)).expire_us_or(200_000), 2_300);
    // 2.01 × 1000 is 2009.9999999999998 in f64: a truncation gives 2,009.
    let ms = std::hint::black_box(2.01_f64);
    assert_eq!((ms * 1000.0) as u64, 2_009, "the case the rounding is for");
    assert_eq!(app(Some(ms)).expire_us(), 2_010);
    assert_eq!(app(Some(1.005)).expire_us_or(200_000), 1_005, "1004.9999999999999 rounded");
    for (ms, us) in
        [(0.0, 0), (0.001, 1), (4.1, 4_100), (0.57, 570), (300.0, 300_000), (1.0004, 1_000), (1.0006, 1_001)]
    {
        assert_eq!(app(Some(ms)).expire_us(), us, "{ms} ms");
    }
}

#[test]
fn the_defaults_are_zero_live_and_the_callers_in_the_simulator() {
    assert_eq!(app(None).expire_us(), 0, "live: a request still queued at its deadline is dropped");
    assert_eq!(app(None).expire_us_or(200_000), 200_000, "an experiment passes one SLO");
}

#[test]
fn a_config_file_value_goes_through_the_same_conversion() {
    let text =
        "name = \"a\"\nslo_ms = 200\nworkers = 1\nprofile = \"p.toml\"\nexpire_after_ms = 2.3\npolicy = \"fixed\"\n";
    let a: AppConfig = toml::from_str(text).unwrap();
    assert_eq!(a.expire_us(), 2_300);
}

/// The code of `file` (under `host/`) without its comments and without its
/// trailing `#[cfg(test)] mod tests`.
fn code(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = text.find("#[cfg(test)]\nmod tests").map_or(text.as_str(), |at| &text[..at]).to_string();
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

#[test]
fn the_live_host_and_the_simulator_both_convert_with_it() {
    // Live: the worker's expiry comes from `expire_us` (`App::new`).
    assert!(code("server/src/app.rs").contains(".expire_us()"), "server/src/app.rs no longer calls expire_us");
    // Simulated: an experiment's app, with the experiment's default of one SLO.
    assert!(code("sim/src/engine.rs").contains(".expire_us_or("), "sim/src/engine.rs no longer calls expire_us_or");
    // And no other conversion of the field: a line that reads `expire_after_ms`
    // and scales by 1000 must go through one of the two functions.
    for file in [
        "server/src/app.rs",
        "server/src/worker.rs",
        "server/src/pipeline.rs",
        "sim/src/engine.rs",
        "sim/src/whatif.rs",
    ] {
        for line in code(file).lines().filter(|l| l.contains("expire_after_ms") && l.contains("1000")) {
            assert!(line.contains("expire_us"), "{file}: a conversion of its own: {}", line.trim());
        }
    }
}
