//! `cargo xtask demo`: the main job on the embedded default config.
//!
//! Starts `target/release/sluice serve` (the trained ImageNet family,
//! EfficientNet-Lite0/1/2, on ONNX Runtime, policy `jellyfish`), sends photographs
//! with known classes (`models/imagenet-trained/samples.f32`) with `sluice loadgen`,
//! swaps the policy twice while traffic flows (to `fixed` on EfficientNet-Lite2, then
//! back to `jellyfish`), prints what happened, and shuts the server down gracefully.
//! The accuracy loadgen prints is the mean published top-1 of the variants that
//! answered in time, which for this family is the real accuracy of the served weights.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The admin token the demo server runs with.
const TOKEN: &str = "sluice-demo-token";

/// The photographs the demo sends: Grace Hopper, Chelsea the cat and a cup of
/// coffee, preprocessed for the trained family (xtask/scripts/make_trained.py).
const SAMPLES: &str = "models/imagenet-trained/samples.f32";

pub fn run(root: &Path) -> Result<()> {
    let bin = root.join("target/release/sluice");
    let samples = root.join(SAMPLES);
    if !samples.exists() {
        bail!("{} is missing: run `cargo xtask setup`", samples.display());
    }
    println!("== starting `sluice serve` on the embedded default config ==");
    let mut server = Command::new(&bin)
        .current_dir(root)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("SLUICE_ADMIN_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let stdout = server.stdout.take().context("server stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let started = Instant::now();
    let addr = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(a) = line.strip_prefix("sluice listening on http://") {
                    break a.trim().to_string();
                }
            }
            _ => {
                let _ = server.kill();
                bail!("the server exited before listening (see its log above)");
            }
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = server.kill();
            bail!("the server did not start listening within 120 s");
        }
    };
    println!(
        "== server up at {addr} after {:.1} s; sending real image tensors for 24 s ==",
        started.elapsed().as_secs_f64()
    );
    println!("   swaps: at 8 s to `fixed` (efficientnet_lite2), at 16 s back to `jellyfish`");
    let status = Command::new(&bin)
        .current_dir(root)
        .args([
            "loadgen",
            "--addr",
            &addr,
            "--app",
            "imagenet",
            "--concurrency",
            "4",
            "--duration",
            "24",
            "--input",
            SAMPLES,
            "--swap",
            r#"8:fixed:{"model":"efficientnet_lite2"}"#,
            "--swap",
            "16:jellyfish",
            "--admin-token",
            TOKEN,
        ])
        .status();
    println!("== graceful shutdown (SIGTERM): queued requests are answered first ==");
    let _ = Command::new("kill").args(["-TERM", &server.id().to_string()]).status();
    let exit = server.wait()?;
    println!("server exited with {exit}");
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => bail!("loadgen failed with {s}"),
        Err(e) => bail!("cannot run loadgen: {e}"),
    }
}
