//! One config vocabulary: an experiment's `[[app]]` is the server's `AppConfig`,
//! and an experiment can simulate the apps of a server config. The same app, given
//! either way, gives byte-identical results; bad files get errors naming the field.

// Not every test binary uses every fixture.
#[allow(dead_code)]
mod common;

use common::{policies, PROFILE};
use sluice_sim::{run_experiment, Experiment};

/// The app as a server config writes it (`executor`, `max_queue` and `fail_mode`
/// are the live host's; the simulator ignores them).
const APP: &str = r#"name = "a"
slo_ms = 40
workers = 2
router = "shortest-queue"
executor = "emulated"
profile = "p.toml"
max_batch = 2
max_queue = 64
fail_mode = "unbind"
policy = "fixed"
params = { model = "m" }
"#;

fn header() -> String {
    format!("version = 1\nname = \"t\"\nduration_s = 0.5\nbuiltin_policy_dir = \"{}\"\n", policies().display())
}

#[test]
fn a_server_config_simulates_like_the_same_app_inline() {
    let dir = tempfile::tempdir().unwrap();
    // The server config and its profile in a directory of their own: the app's
    // paths resolve against the config, not against the experiment.
    let served = dir.path().join("served");
    std::fs::create_dir(&served).unwrap();
    std::fs::write(served.join("p.toml"), PROFILE).unwrap();
    std::fs::write(served.join("server.toml"), format!("listen = \"127.0.0.1:0\"\n[[app]]\n{APP}")).unwrap();
    let from_config = dir.path().join("from-config.toml");
    std::fs::write(
        &from_config,
        format!(
            "{}config = \"served/server.toml\"\n[arrivals]\na = {{ kind = \"poisson\", rate_qps = 150 }}\n",
            header()
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("p.toml"), PROFILE).unwrap();
    let inline = dir.path().join("inline.toml");
    std::fs::write(&inline, format!("{}[[app]]\n{APP}arrivals = {{ kind = \"poisson\", rate_qps = 150 }}\n", header()))
        .unwrap();

    let run = |path: &std::path::Path| {
        let (e, base) = Experiment::load(path).unwrap();
        let out = run_experiment(&e, &base, false).unwrap();
        serde_json::to_string(&out.results).unwrap()
    };
    let (a, b) = (run(&from_config), run(&inline));
    assert!(a.contains("\"requests\":"), "{a}");
    assert_eq!(a, b);
}

#[test]
fn arrivals_are_required_and_must_name_an_app() {
    let dir = tempfile::tempdir().unwrap();
    let parse = |body: &str| {
        Experiment::parse(&format!("{}{body}", header()), "e.toml", dir.path()).map(|_| ()).unwrap_err().to_string()
    };
    let e = parse(&format!("[[app]]\n{APP}"));
    assert_eq!(e, "e.toml: app.a.arrivals: required in an experiment (or give it in [arrivals])");
    let e = parse(&format!("[arrivals]\nb = {{ kind = \"poisson\", rate_qps = 1 }}\n[[app]]\n{APP}"));
    assert_eq!(e, "e.toml: arrivals.b: no app of that name");
    // An app's fields are checked as strictly as the server checks them.
    let e = parse(&format!(
        "[[app]]\n{}arrivals = {{ kind = \"poisson\", rate_qps = 1 }}\n",
        APP.replace("workers = 2", "wokers = 2")
    ));
    assert!(e.starts_with("e.toml: ") && e.contains("unknown field `wokers`"), "{e}");
    let e = parse(&format!(
        "[[app]]\n{}arrivals = {{ kind = \"poisson\", rate_qps = 1 }}\n",
        APP.replace("workers = 2", "workers = 0")
    ));
    assert_eq!(e, "e.toml: app.a.workers: expected 1 to 4096 workers");
    let weighted = APP.replace("router = \"shortest-queue\"", "router = \"weighted\"\nweights = [1]");
    let e = parse(&format!("[[app]]\n{weighted}arrivals = {{ kind = \"poisson\", rate_qps = 1 }}\n"));
    assert_eq!(e, "e.toml: app.a.weights: expected 2 weights (one per worker), got 1");
    let e = parse("config = \"missing.toml\"\n");
    assert!(e.contains("missing.toml: cannot read"), "{e}");
}
