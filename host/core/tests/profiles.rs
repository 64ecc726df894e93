//! Every model profile under `profiles/` parses with the strict parser
//! (`sluice_core::profile::Profile::load`), holds at least one model, and survives a
//! write/read round trip.
//!
//! Naming convention (documented in `profiles/README.md`): a `profiles/*.toml`
//! whose file stem ends in `-capacity` or `-accuracy` is a data file with its own
//! schema, not a model profile (e.g. `infadapter-resnet-capacity.toml`,
//! `imagenet-accuracy.toml`). Those are only required to be valid TOML; every
//! other `profiles/*.toml` must be a valid profile.

use std::path::{Path, PathBuf};

use sluice_core::profile::Profile;

/// File-stem suffixes of the non-profile data files in `profiles/`.
const DATA_FILE_SUFFIXES: [&str; 2] = ["-capacity", "-accuracy"];

fn profile_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../profiles")
}

/// The `*.toml` files in `profiles/`, sorted, split into (profiles, data files).
fn toml_files() -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(profile_dir())
        .expect("profiles/ is readable")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files.into_iter().partition(|p| {
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        !DATA_FILE_SUFFIXES.iter().any(|suffix| stem.ends_with(suffix))
    })
}

#[test]
fn every_profile_parses_and_has_models() {
    let (profiles, _) = toml_files();
    assert!(!profiles.is_empty(), "no profiles found in {}", profile_dir().display());
    let mut failures = Vec::new();
    for path in &profiles {
        match Profile::load(path) {
            Ok(profile) => {
                if profile.models.is_empty() {
                    failures.push(format!("{}: no models", path.display()));
                    continue;
                }
                let written = profile.to_toml_string();
                match Profile::parse(&written, &path.display().to_string()) {
                    Ok(again) if again == profile => {}
                    Ok(_) => failures.push(format!("{}: differs after a write/read round trip", path.display())),
                    Err(e) => failures.push(format!("written form does not parse: {e}")),
                }
                println!("{}: {} model(s)", path.display(), profile.models.len());
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "invalid profiles:\n{}", failures.join("\n"));
}

#[test]
fn data_files_are_valid_toml() {
    let (_, data) = toml_files();
    for path in &data {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(e) = text.parse::<toml::Table>() {
            panic!("{}: not valid TOML: {e}", path.display());
        }
    }
}

#[test]
fn infadapter_capacity_table_is_complete() {
    let path = profile_dir().join("infadapter-resnet-capacity.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table: toml::Table = text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(table.get("kind").and_then(|v| v.as_str()), Some("capacity"));
    let models = table["model"].as_array().expect("[[model]] tables");
    assert_eq!(models.len(), 5, "ResNet-18, 34, 50, 101, 152");
    let points = table["point"].as_array().expect("point array");
    // 5 models x 20 core counts x 4 SLAs, as in capacity_result_Feb_21.csv.
    assert_eq!(points.len(), 400);
    for p in points {
        let p = p.as_table().expect("inline table");
        for key in ["model", "cpus", "sla_us", "capacity_rps", "saturation_rps"] {
            assert!(p.contains_key(key), "{}: point without `{key}`: {p:?}", path.display());
        }
    }
}
