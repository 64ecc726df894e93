//! Every config under `examples/` parses, names files that exist, and its profiles
//! hold the models it asks for: examples must keep running.

use std::path::Path;

#[test]
fn example_configs_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let config = sluice_server::config::Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        for app in &config.apps {
            let profile = sluice_core::profile::Profile::load(&app.profile)
                .unwrap_or_else(|e| panic!("{}: app {}: {e}", path.display(), app.name));
            for m in app.models.iter().flatten() {
                assert!(
                    profile.model(m).is_some(),
                    "{}: app {}: model {m} not in its profile",
                    path.display(),
                    app.name
                );
            }
            if let Some(dir) = &app.model_dir {
                assert!(
                    dir.is_dir(),
                    "{}: model_dir {} is missing (run `cargo xtask setup`)",
                    path.display(),
                    dir.display()
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} example configs");
}
