//! `sluice policy build`: the component of the policy crate in a directory, built for
//! the target and profile policies use (DESIGN.md, toolchain facts):
//! `wasm32-unknown-unknown` (a `wasip2` guest would import 13 WASI interfaces
//! through std) with the crate's `policy` profile (opt-level 3, LTO,
//! `panic = "abort"`), linked by `wasm-component-ld` into a component.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use clap::Args;

/// The guest target.
pub const TARGET: &str = "wasm32-unknown-unknown";

/// The first 8 bytes of a component (a core module has version 1, layer 0).
pub const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

/// `sluice policy build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The policy crate (holding its Cargo.toml), or a Python policy (holding a
    /// pyproject.toml with `[tool.sluice]`).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Also copy the component here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Pass `--offline` to cargo (no registry access; dependencies must be cached).
    #[arg(long)]
    pub offline: bool,
}

/// Fails with the `rustup` line when the toolchain used in `dir` lacks the target.
pub fn check_target(dir: &Path) -> Result<()> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .current_dir(dir)
        .args(["--print", "sysroot"])
        .output()
        .with_context(|| format!("running {} --print sysroot (is Rust installed?)", rustc.to_string_lossy()))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !sysroot.join("lib/rustlib").join(TARGET).exists() {
        bail!(
            "the Wasm target {TARGET} is not installed for this toolchain ({}): run `rustup target add {TARGET}`",
            sysroot.display()
        );
    }
    Ok(())
}

/// Builds the crate in `dir`; the component's path (in the crate's target directory).
pub fn build(dir: &Path, offline: bool) -> Result<PathBuf> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).with_context(|| {
        format!("no policy crate in {}: no Cargo.toml (create one with `sluice policy new <name>`)", dir.display())
    })?;
    check_target(dir)?;
    // The profile policies are built with; a crate without it (made by hand) gets
    // `release` and a note, rather than cargo's "profile `policy` is not defined".
    let profile = if text.lines().any(|l| l.trim() == "[profile.policy]") {
        "policy"
    } else {
        eprintln!(
            "note: {} has no [profile.policy]; building with `release` (see docs/writing-a-policy.md for the \
             profile: opt-level 3, lto, panic = \"abort\")",
            manifest.display()
        );
        "release"
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(dir)
        .args(["build", "--target", TARGET, "--profile", profile, "--message-format=json-render-diagnostics"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if offline {
        command.arg("--offline");
    }
    let mut child = command.spawn().with_context(|| format!("running {command:?}"))?;
    // Cargo's JSON messages name what it wrote: the last `.wasm` artifact is ours.
    let mut wasm = None;
    if let Some(stdout) = child.stdout.take() {
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line?;
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
            if msg["reason"] != "compiler-artifact" {
                continue;
            }
            for f in msg["filenames"].as_array().into_iter().flatten() {
                if let Some(f) = f.as_str().filter(|f| f.ends_with(".wasm")) {
                    wasm = Some(PathBuf::from(f));
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("cargo build failed in {} ({status})", dir.display());
    }
    let wasm = wasm.with_context(|| {
        format!(
            "cargo built no .wasm in {}: is the crate a `cdylib` (`[lib] crate-type = [\"cdylib\", \"rlib\"]`)?",
            dir.display()
        )
    })?;
    let bytes = std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))?;
    if !bytes.starts_with(&COMPONENT_HEADER) {
        bail!(
            "{} is a core WebAssembly module, not a component: link {TARGET} with wasm-component-ld \
             (`.cargo/config.toml`: `[target.{TARGET}]` `linker = \"wasm-component-ld\"`)",
            wasm.display()
        );
    }
    Ok(wasm)
}

/// Runs `sluice policy build`: a Rust crate with cargo, a Python policy (a
/// `pyproject.toml` with `[tool.sluice]`) with componentize-py.
pub fn run(args: BuildArgs) -> Result<()> {
    let wasm = if super::python::is_python_policy(&args.dir) {
        super::python::build(&args.dir, &super::new::default_sdk())?
    } else {
        build(&args.dir, args.offline)?
    };
    let size = std::fs::metadata(&wasm)?.len();
    let shown = match &args.out {
        Some(out) => {
            std::fs::copy(&wasm, out).with_context(|| format!("copying to {}", out.display()))?;
            out.clone()
        }
        None => wasm,
    };
    println!("built {} ({:.1} KiB)", shown.display(), size as f64 / 1024.0);
    println!("next: sluice policy check {}", shown.display());
    Ok(())
}
