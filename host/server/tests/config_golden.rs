//! Golden tests: each `golden/config/*.toml` is a bad config whose error message is
//! pinned in the `.err` file beside it. Set `SLUICE_BLESS=1` to (re)write them.

use std::path::Path;

#[test]
fn bad_configs_give_the_pinned_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/config");
    let bless = std::env::var_os("SLUICE_BLESS").is_some();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let name = format!("golden/config/{}", path.file_name().unwrap().to_string_lossy());
        let text = std::fs::read_to_string(&path).unwrap();
        let err = match sluice_server::config::Config::parse(&text, &name, Path::new("")) {
            Ok(_) => panic!("{name} should be refused"),
            Err(e) => e.to_string(),
        };
        let expected_path = path.with_extension("err");
        if bless {
            std::fs::write(&expected_path, format!("{err}\n")).unwrap();
        }
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{} is missing: run with SLUICE_BLESS=1", expected_path.display()));
        assert_eq!(err.trim_end(), expected.trim_end(), "{name}");
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} golden configs found");
}
