//! `sluice policy new|build|check|bench|upload|swap`: a policy author's loop, end to
//! end. One test compiles a Wasm crate (`new` + `build`), into a target directory
//! shared under `target/` so that it is cached between runs; the others use the
//! template's component that `cargo xtask policies` builds.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sluice_loadgen::Client;

mod common;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.env("RUST_LOG", "error").env_remove("SLUICE_ADMIN_TOKEN");
    c
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn err(out: Output) -> String {
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The template's component (`cargo xtask policies`).
fn template_wasm() -> PathBuf {
    let p = root().join("target/examples/policy-template.wasm");
    assert!(p.is_file(), "{} is missing: run `cargo xtask policies`", p.display());
    p
}

#[test]
fn new_then_build_gives_a_component_that_checks() {
    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path().join("fast-lane");
    let out = ok(sluice().args(["policy", "new", "fast-lane", "--dir"]).arg(&krate).output().unwrap());
    assert!(out.contains("created policy crate `fast-lane`"), "{out}");
    let cargo = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    let sdk = root().join("sdk");
    assert!(cargo.contains(&format!("sluice-sdk = {{ path = {:?} }}", sdk.display().to_string())), "{cargo}");
    assert!(std::fs::read_to_string(krate.join("src/lib.rs")).unwrap().contains("export_policy!(FastLane)"));
    // A second `new` into the same directory is refused, naming it.
    let e = err(sluice().args(["policy", "new", "fast-lane", "--dir"]).arg(&krate).output().unwrap());
    assert!(e.contains("already exists"), "{e}");

    // The one Wasm build of the suite; its target directory is kept under target/.
    let target = root().join("target/policy-cli-build");
    let out = ok(sluice()
        .args(["policy", "build", "--offline", "--dir"])
        .arg(&krate)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap());
    let wasm = target.join("wasm32-unknown-unknown/policy/fast_lane.wasm");
    assert!(out.contains(&wasm.display().to_string()), "{out}");
    let check = ok(sluice().args(["policy", "check", "--calls", "200", "--json"]).arg(&wasm).output().unwrap());
    let v: serde_json::Value = serde_json::from_str(&check).unwrap();
    assert_eq!(v["world"], "sluice:policy@0.1.0");
    assert_eq!(v["decision_valid"], true, "{v}");
}

#[test]
fn build_without_the_wasm_target_says_how_to_add_it() {
    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path().join("p");
    ok(sluice().args(["policy", "new", "p", "--dir"]).arg(&krate).output().unwrap());
    // A toolchain whose sysroot has no wasm32 target.
    let rustc = dir.path().join("rustc");
    std::fs::write(&rustc, format!("#!/bin/sh\necho {}\n", dir.path().display())).unwrap();
    std::fs::set_permissions(&rustc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let e = err(sluice().args(["policy", "build", "--dir"]).arg(&krate).env("RUSTC", &rustc).output().unwrap());
    assert!(e.contains("rustup target add wasm32-unknown-unknown"), "{e}");
    // No crate at all.
    let e = err(sluice().args(["policy", "build", "--dir"]).arg(dir.path().join("none")).output().unwrap());
    assert!(e.contains("no policy crate") && e.contains("sluice policy new"), "{e}");
    // An SDK path that is not the SDK.
    let e = err(sluice().args(["policy", "new", "q", "--sdk-path"]).arg(dir.path()).output().unwrap());
    assert!(e.contains("--sdk-path"), "{e}");
}

#[test]
fn check_reports_the_world_the_interface_and_the_decide_cost() {
    let out = ok(sluice().args(["policy", "check", "--calls", "500"]).arg(template_wasm()).output().unwrap());
    assert!(out.contains("a valid sluice:policy@0.1.0 component"), "{out}");
    assert!(out.contains("exports: ") && out.contains("decide"), "{out}");
    assert!(out.contains("observe: called after every batch"), "{out}");
    assert!(out.contains("µs per call over 500 calls"), "{out}");
    // Jellyfish says its `observe` does nothing (the SDK's `sluice:hints` section);
    // clipper-aimd learns from every batch.
    let check = |name: &str| -> serde_json::Value {
        let wasm = root().join(format!("target/policies/{name}.wasm"));
        serde_json::from_str(&ok(sluice()
            .args(["policy", "check", "--calls", "10", "--json"])
            .arg(wasm)
            .output()
            .unwrap()))
        .unwrap()
    };
    assert_eq!(check("jellyfish")["observed"], false);
    assert_eq!(check("clipper-aimd")["observed"], true);
    // A core module is refused as an upload would be.
    let dir = tempfile::tempdir().unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let e = err(sluice().args(["policy", "check"]).arg(&core).output().unwrap());
    assert!(e.contains("core WebAssembly module"), "{e}");
    let e = err(sluice().args(["policy", "check"]).arg(dir.path().join("missing.wasm")).output().unwrap());
    assert!(e.contains("missing.wasm"), "{e}");
}

#[test]
fn bench_compares_on_the_standard_scenarios() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("bench");
    let out = ok(sluice()
        .current_dir(root())
        .args([
            "policy",
            "bench",
            "--against",
            "jellyfish",
            "--duration",
            "3",
            "--scale",
            "0.1",
            "--workers",
            "6",
            "--out",
        ])
        .arg(&out_dir)
        .arg(template_wasm())
        .output()
        .unwrap());
    assert!(out.contains("policy-template vs jellyfish"), "{out}");
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("results.json")).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 10, "5 scenarios × 2 policies: {rows:?}");
    for scenario in ["constant 100", "constant 200", "constant 300", "twitter", "bursts"] {
        for policy in ["policy-template", "jellyfish"] {
            let r = rows.iter().find(|r| r["scenario"] == scenario && r["policy"] == policy);
            assert!(r.is_some_and(|r| r["requests"].as_u64().unwrap() > 0), "{scenario} {policy}");
        }
    }
    for svg in ["accuracy.svg", "violation.svg"] {
        assert!(std::fs::read_to_string(out_dir.join(svg)).unwrap().starts_with("<svg"));
    }
    let e = err(sluice().args(["policy", "bench", "--against", "nope"]).arg(template_wasm()).output().unwrap());
    assert!(e.contains("policy `nope`"), "{e}");
}

#[test]
fn bench_refuses_sizes_that_would_exhaust_memory() {
    // `--duration 1e12` or `--scale 1e9` drew every arrival up front and grew to
    // 22 GB: now clap's usage error (exit 2) naming the flag, or (both in range, too
    // much together) one line naming both (exit 1), before anything runs.
    let bench = |args: &[&str]| {
        let out = sluice().args(["policy", "bench"]).args(args).arg(template_wasm()).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for (flag, value) in [
        ("--duration", "1e12"),
        ("--duration", "0"),
        ("--duration", "inf"),
        ("--scale", "1e9"),
        ("--scale", "0"),
        ("--workers", "0"),
        ("--workers", "100000"),
        ("--seed", "18446744073709551615"),
    ] {
        let (code, e) = bench(&[flag, value]);
        assert_eq!(code, Some(2), "{flag} {value}: {e}");
        assert!(e.contains(flag) && e.contains(value), "{e}");
    }
    let (code, e) = bench(&["--scale", "100", "--duration", "1000"]);
    assert_eq!(code, Some(1), "{e}");
    assert!(e.contains("--scale 100 × --duration 1000: the busiest scenario would simulate about 390500000"), "{e}");
}

#[test]
fn upload_and_swap_against_a_real_server() {
    let root = root();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "listen = \"127.0.0.1:0\"\nadmin_token = \"secret\"\nbuiltin_policy_dir = \"{root}/target/policies\"\npolicy_dir = \"{dir}/p\"\n\n\
         [[app]]\nname = \"emu\"\nslo_ms = 100\nworkers = 2\nexecutor = \"emulated\"\nprofile = \"{root}/examples/profiles/zero-latency.toml\"\n\
         policy = \"jellyfish\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\n",
        root = root.display(),
        dir = dir.path().display()
    );
    let (mut child, mut out) = common::serve(&config, dir.path());
    let addr = common::address(&mut out, "sluice listening on http://");
    let server = format!("http://{addr}");
    let result = std::panic::catch_unwind(|| {
        let wasm = template_wasm();
        // Without a token: refused here, naming the variable.
        let e = err(sluice().args(["policy", "upload", "--server", &server]).arg(&wasm).output().unwrap());
        assert!(e.contains("SLUICE_ADMIN_TOKEN"), "{e}");
        // A wrong token: the server's 401, with the hint.
        let e = err(sluice()
            .args(["policy", "upload", "--server", &server])
            .arg(&wasm)
            .env("SLUICE_ADMIN_TOKEN", "wrong")
            .output()
            .unwrap());
        assert!(e.contains("HTTP 401"), "{e}");
        let out = ok(sluice()
            .args(["policy", "upload", "--name", "mine", "--server", &server])
            .arg(&wasm)
            .env("SLUICE_ADMIN_TOKEN", "secret")
            .output()
            .unwrap());
        assert!(out.contains("uploaded `mine`"), "{out}");
        let out = ok(sluice()
            .args(["policy", "swap", "emu", "mine", "--params", "{\"max_batch\": 2}", "--server", &server])
            .env("SLUICE_ADMIN_TOKEN", "secret")
            .output()
            .unwrap());
        assert!(out.contains("app `emu` now runs `mine`"), "{out}");
        // The server says so too.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let status = rt.block_on(async {
            let mut c = Client::connect(addr).await.unwrap();
            c.request("GET", "/admin/apps/emu", &[("authorization", "Bearer secret")], b"").await.unwrap().json()
        });
        assert!(status.to_string().contains("\"mine\""), "{status}");
        // A swap to a policy the server does not have is refused with its reason.
        let e = err(sluice()
            .args(["policy", "swap", "emu", "absent", "--server", &server])
            .env("SLUICE_ADMIN_TOKEN", "secret")
            .output()
            .unwrap());
        assert!(e.contains("swap refused: HTTP 404") && e.contains("absent"), "{e}");
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
