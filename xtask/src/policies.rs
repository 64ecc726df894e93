//! Build policy crates into WebAssembly components under `target/policies/`.
//!
//! Policies are built for `wasm32-unknown-unknown` with the workspace's `policy`
//! profile; `.cargo/config.toml` links that target with `wasm-component-ld`
//! (shipped with rustup), so the `.wasm` cargo writes already is a component
//! whose only imports are the sluice WIT contract. No `wasm-tools` step needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The policies shipped with sluice (crates `policies/<name>`, package
/// `policy-<name>`).
pub const BUILTIN: &[&str] = &[
    "jellyfish",
    "fixed",
    "proteus-batching",
    "nexus",
    "clipper-aimd",
    "lazy-drop",
    "spread-drop",
    "model-switching",
    "ramsis",
];

/// Test fixtures built the same way (crates under `tests/fixtures/<name>`), into
/// `target/fixtures/`: the tests upload them; no server offers them as built-ins.
pub const FIXTURES: &[&str] = &["misbehave"];

/// The guest target. Not `wasm32-wasip2`: through std that imports 13 WASI
/// interfaces even when a policy does no I/O (DESIGN.md, toolchain facts).
const TARGET: &str = "wasm32-unknown-unknown";

/// The cargo profile for policies (root `Cargo.toml`: opt-level 3, LTO,
/// `panic = "abort"` so a panic is a plain trap).
const PROFILE: &str = "policy";

/// The first 8 bytes of a component binary: `\0asm`, then version 0x0d and
/// layer 1 (a core module has version 1, layer 0).
const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

/// Builds the policies `names` (package `policy-<name>` each) in one cargo
/// invocation and copies each component to `<root>/target/policies/<name>.wasm`
/// (fixtures: `<root>/target/fixtures/<name>.wasm`).
/// Returns those paths, in the order of `names`.
///
/// Fails if cargo fails or if an output is not a component (which means the
/// target's linker is not `wasm-component-ld`).
pub fn build_policies(root: &Path, names: &[&str]) -> Result<Vec<PathBuf>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(root).args(["build", "--target", TARGET, "--profile", PROFILE]);
    for name in names {
        command.arg("-p").arg(format!("policy-{name}"));
    }
    let status = command.status().with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("building policies {names:?} failed ({status})");
    }

    // Respect CARGO_TARGET_DIR, as cargo itself did (a relative one is
    // relative to where cargo ran, i.e. `root`).
    let target = std::env::var_os("CARGO_TARGET_DIR").map(|dir| root.join(dir)).unwrap_or_else(|| root.join("target"));
    let built = target.join(TARGET).join(PROFILE);
    let mut paths = Vec::with_capacity(names.len());
    for name in names {
        // Fixtures are not built-ins: a server's `builtin_policy_dir` must not offer
        // a policy that misbehaves on purpose. They go to `target/fixtures/`, and a
        // copy left in `target/policies/` by an older checkout is removed.
        let fixture = FIXTURES.contains(name);
        let out_dir = target.join(if fixture { "fixtures" } else { "policies" });
        std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
        if fixture {
            let _ = std::fs::remove_file(target.join("policies").join(format!("{name}.wasm")));
        }
        let from = built.join(format!("policy_{}.wasm", name.replace('-', "_")));
        let to = out_dir.join(format!("{name}.wasm"));
        let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
        if !bytes.starts_with(&COMPONENT_HEADER) {
            bail!(
                "{} is not a WebAssembly component (is `linker = \"wasm-component-ld\"` \
                 set for {TARGET} in .cargo/config.toml?)",
                from.display()
            );
        }
        std::fs::write(&to, &bytes).with_context(|| format!("writing {}", to.display()))?;
        paths.push(to);
    }
    Ok(paths)
}

/// Standalone policy crates outside the workspace (`examples/<name>`, package
/// `<name>`): built like the built-ins but *not* installed as built-ins, since
/// the tests upload them through the admin API as a third party would.
pub const EXAMPLES: &[&str] = &["policy-template", "combined-policy"];

/// Builds each standalone example crate `examples/<name>` into
/// `<target>/examples/<name>.wasm` and returns those paths. They keep their own
/// `Cargo.lock`, as a policy author's crate would, and their own target
/// directory (`<target>/examples-build`): sharing the workspace's would compile
/// the SDK under the same artifact name from two paths (workspace member vs.
/// path dependency), and each build would invalidate the other's rlibs.
pub fn build_examples(root: &Path, names: &[&str]) -> Result<Vec<PathBuf>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = std::env::var_os("CARGO_TARGET_DIR").map(|dir| root.join(dir)).unwrap_or_else(|| root.join("target"));
    let out_dir = target.join("examples");
    let build_dir = target.join("examples-build");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut paths = Vec::with_capacity(names.len());
    for name in names {
        let dir = root.join("examples").join(name);
        let mut command = Command::new(&cargo);
        command.current_dir(&dir).env("CARGO_TARGET_DIR", &build_dir).args([
            "build",
            "--target",
            TARGET,
            "--profile",
            PROFILE,
        ]);
        let status = command.status().with_context(|| format!("running {command:?}"))?;
        if !status.success() {
            bail!("building example {name} failed ({status})");
        }
        let from = build_dir.join(TARGET).join(PROFILE).join(format!("{}.wasm", name.replace('-', "_")));
        let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
        if !bytes.starts_with(&COMPONENT_HEADER) {
            bail!("{} is not a WebAssembly component", from.display());
        }
        let to = out_dir.join(format!("{name}.wasm"));
        std::fs::write(&to, &bytes).with_context(|| format!("writing {}", to.display()))?;
        paths.push(to);
    }
    Ok(paths)
}

/// Python policies (`policies/python/<name>`, each a module on `sdk/python` with a
/// `pyproject.toml` naming it), built with componentize-py into
/// `target/policies/<name>-py.wasm`: the ports of the Rust policies of the same
/// name that `tests/python_policies.rs` compares with them.
pub const PYTHON: &[&str] = &["jellyfish", "spread-drop"];

/// Builds each Python policy `policies/python/<name>` into
/// `<target>/policies/<name>-py.wasm` with the venv's componentize-py (which
/// `cargo xtask setup` installs), unless the component is newer than every source
/// it is built from (componentize-py takes 10-25 s a policy). This is the build
/// `sluice policy build` runs for a Python policy (host/cli/src/commands/policy/python.rs);
/// xtask does not depend on the host crates, so the few lines are repeated here.
pub fn build_python(root: &Path, names: &[&str]) -> Result<Vec<PathBuf>> {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(|dir| root.join(dir)).unwrap_or_else(|| root.join("target"));
    let mut paths = Vec::new();
    for name in names {
        let out = target.join("policies").join(format!("{name}-py.wasm"));
        componentize(root, &root.join("policies/python").join(name), &name.replace('-', "_"), &out)?;
        paths.push(out);
    }
    for module in PYTHON_FIXTURES {
        let out = target.join("fixtures").join(format!("{}.wasm", module.replace('_', "-")));
        componentize(root, &root.join("tests/fixtures/python"), module, &out)?;
        paths.push(out);
    }
    Ok(paths)
}

/// Python test fixtures: modules in `tests/fixtures/python`, built into
/// `target/fixtures/<module, with `-` for `_`>.wasm` (uploaded by the tests, never
/// offered as built-ins).
pub const PYTHON_FIXTURES: &[&str] = &["misbehave_py"];

/// Builds `module` of `dir` into `out` unless `out` is newer than every source.
fn componentize(root: &Path, dir: &Path, module: &str, out: &Path) -> Result<()> {
    let tool = root.join(".venv/bin/componentize-py");
    if !tool.exists() {
        bail!("{} is missing: run `cargo xtask setup`", tool.display());
    }
    let sdk = root.join("sdk/python");
    let newest = [dir, &sdk, &root.join("wit")]
        .iter()
        .flat_map(|d| walk(d))
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max();
    let built = std::fs::metadata(out).and_then(|m| m.modified()).ok();
    if built.is_some() && newest.is_some() && newest <= built {
        return Ok(());
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let status = Command::new(&tool)
        .arg("--quiet")
        .arg("-d")
        .arg(root.join("wit"))
        .args(["-w", "policy-with-status", "componentize", module, "-p"])
        .arg(dir)
        .arg("-p")
        .arg(&sdk)
        .arg("-o")
        .arg(out)
        .status()
        .context("running componentize-py")?;
    if !status.success() {
        bail!("componentize-py failed for {module} in {} ({status})", dir.display());
    }
    let bytes = std::fs::read(out).with_context(|| format!("reading {}", out.display()))?;
    if !bytes.starts_with(&COMPONENT_HEADER) {
        bail!("{} is not a WebAssembly component", out.display());
    }
    // Every module built here keeps `OBSERVES = False` (the ports keep the Rust
    // crates' `false`): the host skips `observe` after each batch, as for the crates.
    std::fs::write(out, with_hints(&bytes, false)).with_context(|| format!("writing {}", out.display()))
}

/// Every file under `dir` (but `__pycache__`, `build` and hidden ones).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "__pycache__" || name == "build" {
            continue;
        }
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// `component` with the `sluice:hints` custom section appended (the runtime's
/// `with_hints`, `host/core/src/runtime.rs`: format 1, then whether `observe` is used).
fn with_hints(component: &[u8], observes: bool) -> Vec<u8> {
    const NAME: &[u8] = b"sluice:hints";
    // Both lengths are below 128, so each LEB128 is one byte.
    let payload_len = 1 + NAME.len() + 2;
    let mut out = component.to_vec();
    out.extend_from_slice(&[0, payload_len as u8, NAME.len() as u8]);
    out.extend_from_slice(NAME);
    out.extend_from_slice(&[1, u8::from(observes)]);
    out
}
