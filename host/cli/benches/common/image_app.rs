//! The app the overload and admission benches drive: one emulated app of real
//! image-sized inputs (FP32 [3, 224, 224]) on the light ImageNet CPU profile, 2
//! workers, batches of at most 4, a 400 ms SLO, `shortest-queue` routing (the
//! setting of the independent comparison quoted in issue 13), served by the real
//! `sluice serve` in a process of its own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Result;

/// The app's SLO, ms.
pub const SLO_MS: f64 = 400.0;
/// Its workers.
pub const WORKERS: f64 = 2.0;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One scenario: a policy, its params, the variants, and the capacity the profile
/// gives for what it serves (req/s).
pub struct Scenario {
    /// The policy.
    pub policy: &'static str,
    /// Its params, a TOML inline table.
    pub params: &'static str,
    /// The variants it serves.
    pub models: &'static [&'static str],
    /// Requests/s the two workers serve by the profile.
    pub capacity: f64,
}

/// Requests/s one worker serves with `p95` (µs at batch 1, 2, 4, 8) at batches ≤ 4.
fn per_worker(p95: [f64; 4]) -> f64 {
    [(1.0, p95[0]), (2.0, p95[1]), (4.0, p95[2])].iter().map(|(b, us)| b / us * 1e6).fold(0.0, f64::max)
}

/// `fixed` on ResNet-50, and jellyfish choosing between inception_v1 and ResNet-50
/// by load (at overload it serves the faster).
pub fn scenarios() -> [Scenario; 2] {
    let resnet = per_worker([103605.0, 279099.0, 491613.0, 872197.0]);
    let inception = per_worker([80840.0, 163788.0, 298797.0, 597055.0]);
    [
        Scenario {
            policy: "fixed",
            params: "{ model = \"resnet50\" }",
            models: &["resnet50"],
            capacity: WORKERS * resnet,
        },
        Scenario {
            policy: "jellyfish",
            params: "{}",
            models: &["inception_v1", "resnet50"],
            capacity: WORKERS * inception,
        },
    ]
}

/// The server process (killed when dropped) and its config's directory.
pub struct Server {
    process: super::common::ServerProcess,
    /// Where it listens.
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts the app with `s`'s policy; `top` and `app` are extra lines of the
    /// config's top level and of the `[[app]]`.
    pub fn spawn(s: &Scenario, top: &str, app: &str) -> Result<Server> {
        let root = root().canonicalize()?;
        let dir = tempfile::tempdir()?;
        let models: Vec<String> = s.models.iter().map(|m| format!("\"{m}\"")).collect();
        let config = format!(
            "{top}builtin_policy_dir = \"{root}/target/policies\"\npolicy_dir = \"{dir}/policies\"\n\n\
             [[app]]\nname = \"img\"\nslo_ms = {SLO_MS}\nworkers = {WORKERS}\nrouter = \"shortest-queue\"\nexecutor = \"emulated\"\n\
             profile = \"{root}/profiles/imagenet-light-cpu.toml\"\nmodels = [{}]\nmax_batch = 4\nmax_queue = 1024\n\
             {app}policy = \"{}\"\nparams = {}\ninput = {{ name = \"data_0\", datatype = \"FP32\", shape = [3, 224, 224] }}\n",
            models.join(", "),
            s.policy,
            s.params,
            root = root.display(),
            dir = dir.path().display(),
        );
        let path = dir.path().join("image-app.toml");
        std::fs::write(&path, config)?;
        let process = super::common::start_server(&path)?;
        Ok(Server { addr: process.addr, process, _dir: dir })
    }

    /// User + system CPU seconds the server process has used so far
    /// (`ticks_per_second`: [`super::common::clock_ticks`]).
    #[allow(dead_code)] // The admission bench does not read it.
    pub fn cpu_seconds(&self, ticks_per_second: f64) -> f64 {
        self.process.cpu_seconds(ticks_per_second)
    }

    /// Resident memory of the server process, MiB.
    #[allow(dead_code)] // The admission bench does not read it.
    pub fn rss_mib(&self) -> f64 {
        self.process.rss_mib()
    }
}
