//! The server configuration: where to listen, the admin token, policy directories,
//! and the `[[app]]`s — [`AppConfig`], the app vocabulary `sluice_core` shares with
//! the simulator (re-exported here with its enums).
//!
//! Parsing is strict (`deny_unknown_fields`) and every error names the file, the
//! field and what was expected. Relative paths are resolved against the directory
//! of the config file (the current directory for the embedded default).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use sluice_core::app_config::{AppConfig, ExecutorKind, FailMode, InputSpec};
pub use sluice_core::router::RouterMode;

/// The embedded default: app `imagenet`, the light ImageNet family on the onnx
/// executor, served on 127.0.0.1:8080.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// Why a configuration could not be used (core's error for the files sluice reads).
pub type ConfigError = sluice_core::file_error::FileError;

/// The whole server configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `listen = "127.0.0.1:8080"`: address of the HTTP server (`--listen` overrides).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// `admin_token = "..."`: bearer token for `/admin`; `SLUICE_ADMIN_TOKEN` overrides.
    /// Without either, the admin API answers 403 to everything.
    #[serde(default)]
    pub admin_token: Option<String>,
    /// `policy_dir = "var/policies"`: where uploaded policies are kept across restarts.
    #[serde(default = "default_policy_dir")]
    pub policy_dir: PathBuf,
    /// `builtin_policy_dir = "target/policies"`: where `cargo xtask policies` puts the
    /// built-in components, loaded by name (`policy = "jellyfish"`).
    #[serde(default = "default_builtin_dir")]
    pub builtin_policy_dir: PathBuf,
    /// `onnxruntime = "/path/libonnxruntime.so.1.31.1"`: overrides the search for ONNX Runtime.
    #[serde(default)]
    pub onnxruntime: Option<PathBuf>,
    /// `max_body_bytes = 16777216`: larger request bodies get 413.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// `shutdown_grace_ms = 10000`: how long graceful shutdown waits for queues to drain.
    #[serde(default = "default_grace")]
    pub shutdown_grace_ms: u64,
    /// `[[app]]`: the served applications.
    #[serde(rename = "app")]
    pub apps: Vec<AppConfig>,
    /// `[[device]]`: devices the MILP allocator places the apps' variants on (see
    /// [`DeviceConfig`]); with them, every app has one worker per device and routes
    /// by the plan's shares.
    #[serde(rename = "device", default)]
    pub devices: Vec<DeviceConfig>,
    /// `[allocator]`: how plans are made (defaults without the table).
    #[serde(default)]
    pub allocator: AllocatorConfig,
}

/// A group of identical devices.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// `type = "cpu"`: the device type, unique in the config.
    #[serde(rename = "type")]
    pub kind: String,
    /// `count = 2`: devices of this type.
    pub count: u32,
    /// `profile = "profiles/proteus-cpu.toml"`: each variant's latency on this type;
    /// the emulated executor runs it, and the workers' policies see it.
    pub profile: PathBuf,
    /// `memory_mb = 16384`: memory of one device (optional).
    #[serde(default)]
    pub memory_mb: Option<f64>,
}

/// `[allocator]`: the MILP allocator's settings (docs/allocator.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocatorConfig {
    /// `objective = "accuracy"` or `"hardware-first"`.
    #[serde(default)]
    pub objective: sluice_alloc::proteus::Objective,
    /// `formulation = "aggregated"` or `"per-device"`.
    #[serde(default)]
    pub formulation: sluice_alloc::proteus::Formulation,
    /// `batch_sizes = [1, 2, 4, 8]`: batch sizes a capacity is computed for.
    #[serde(default = "default_batch_sizes")]
    pub batch_sizes: Vec<u32>,
    /// `demand_qps = { imagenet = 100 }`: the demand the first plan is made for, per
    /// app (default 1 request/s: every app gets a device).
    #[serde(default)]
    pub demand_qps: BTreeMap<String, f64>,
    /// `period_s = 10`: re-plan this often while serving (Loki's and Proteus's
    /// artifacts: every 10 s).
    #[serde(default = "default_period")]
    pub period_s: f64,
    /// `threshold = 0.2`: re-plan early when an app's forecast moves this far
    /// (relative) from the demand of the plan in force.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// `forecaster = "ewma"` (Proteus: EWMA over the last 20 s) or `"peak-ahead"`
    /// (InfAdapter: the last minute's peak + 10 %).
    #[serde(default)]
    pub forecaster: ForecasterKind,
    /// `min_demand_qps = 1`: each app is planned for at least this much, so it keeps
    /// a device when idle.
    #[serde(default = "default_min_demand")]
    pub min_demand_qps: f64,
    /// `[allocator.ladder]`: demand lowering when a plan is infeasible.
    #[serde(default)]
    pub ladder: sluice_alloc::ladder::Ladder,
    /// `[allocator.solver]`: time limit, MIP gap, threads.
    #[serde(default)]
    pub solver: sluice_alloc::SolverSettings,
}

fn default_batch_sizes() -> Vec<u32> {
    vec![1, 2, 4, 8]
}
fn default_period() -> f64 {
    10.0
}
fn default_threshold() -> f64 {
    0.2
}
fn default_min_demand() -> f64 {
    1.0
}

/// How demand is forecast for a re-plan (`sluice_core::demand`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ForecasterKind {
    /// Proteus's EWMA (com 1.6) over the last 20 one-second counts.
    #[default]
    Ewma,
    /// InfAdapter's: the last minute's peak second, + 10 %.
    PeakAhead,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            objective: Default::default(),
            formulation: Default::default(),
            batch_sizes: default_batch_sizes(),
            demand_qps: BTreeMap::new(),
            period_s: default_period(),
            threshold: default_threshold(),
            forecaster: ForecasterKind::default(),
            min_demand_qps: default_min_demand(),
            ladder: Default::default(),
            solver: Default::default(),
        }
    }
}

fn default_listen() -> SocketAddr {
    "127.0.0.1:8080".parse().expect("valid literal")
}
fn default_policy_dir() -> PathBuf {
    PathBuf::from("var/policies")
}
fn default_builtin_dir() -> PathBuf {
    PathBuf::from("target/policies")
}
fn default_max_body() -> usize {
    16 << 20
}
fn default_grace() -> u64 {
    10_000
}
impl Config {
    /// Reads and validates a config file; relative paths are resolved against its directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { file: file.clone(), source })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Config::parse(&text, &file, &base)
    }

    /// The embedded default configuration, paths relative to the current directory.
    pub fn embedded_default() -> Result<Config, ConfigError> {
        Config::parse(DEFAULT_CONFIG, "<embedded default config>", Path::new(""))
    }

    /// Parses and validates config text; `file` names it in errors, `base` anchors relative paths.
    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Config, ConfigError> {
        let mut config: Config =
            toml::from_str(text).map_err(|e| ConfigError::Parse { file: file.to_string(), message: e.to_string() })?;
        let rebase = |p: &mut PathBuf| {
            if p.is_relative() && !base.as_os_str().is_empty() {
                *p = base.join(&*p);
            }
        };
        rebase(&mut config.policy_dir);
        rebase(&mut config.builtin_policy_dir);
        if let Some(p) = config.onnxruntime.as_mut() {
            rebase(p);
        }
        for app in &mut config.apps {
            app.rebase(base);
        }
        for d in &mut config.devices {
            rebase(&mut d.profile);
        }
        config.validate(file)?;
        Ok(config)
    }

    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |field: String, message: &str| ConfigError::Invalid {
            file: file.to_string(),
            field,
            message: message.to_string(),
        };
        if self.apps.is_empty() {
            return Err(invalid("app".into(), "at least one [[app]] is required"));
        }
        let mut seen = BTreeMap::new();
        for app in &self.apps {
            app.validate().map_err(|e| invalid(e.field, &e.message))?;
            if seen.insert(app.name.clone(), ()).is_some() {
                return Err(invalid(format!("app.{}.name", app.name), "duplicate app name"));
            }
            if app.executor.is_none() {
                return Err(invalid(format!("app.{}.executor", app.name), "required: \"onnx\" or \"emulated\""));
            }
        }
        self.validate_devices(file)
    }

    fn validate_devices(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |field: String, message: &str| ConfigError::invalid(file, field, message);
        let a = &self.allocator;
        a.solver.validate().map_err(|m| invalid("allocator.solver".into(), &m))?;
        for name in a.demand_qps.keys() {
            if !self.apps.iter().any(|x| &x.name == name) {
                return Err(invalid(format!("allocator.demand_qps.{name}"), "no app of that name"));
            }
        }
        if a.demand_qps.values().any(|d| !(d.is_finite() && *d >= 0.0)) {
            return Err(invalid("allocator.demand_qps".into(), "expected non-negative requests/s"));
        }
        if !(a.period_s.is_finite() && a.period_s >= 0.1) {
            return Err(invalid("allocator.period_s".into(), "expected at least 0.1 s"));
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(a.threshold) || !positive(a.min_demand_qps) {
            return Err(invalid("allocator.threshold".into(), "threshold and min_demand_qps must be positive"));
        }
        if a.batch_sizes.is_empty() || a.batch_sizes.contains(&0) {
            return Err(invalid("allocator.batch_sizes".into(), "expected batch sizes of at least 1"));
        }
        if self.devices.is_empty() {
            return Ok(());
        }
        let mut types = BTreeMap::new();
        for d in &self.devices {
            if types.insert(d.kind.clone(), ()).is_some() {
                return Err(invalid(format!("device.{}.type", d.kind), "duplicate device type"));
            }
            if d.count == 0 {
                return Err(invalid(format!("device.{}.count", d.kind), "expected at least 1 device"));
            }
            if d.memory_mb.is_some_and(|m| !(m.is_finite() && m > 0.0)) {
                return Err(invalid(format!("device.{}.memory_mb", d.kind), "expected a positive number of MB"));
            }
        }
        let total: u32 = self.devices.iter().map(|d| d.count).sum();
        for app in &self.apps {
            if app.workers != total {
                return Err(invalid(
                    format!("app.{}.workers", app.name),
                    &format!("with [[device]], one worker per device: expected {total}"),
                ));
            }
            if app.router != RouterMode::Weighted {
                return Err(invalid(
                    format!("app.{}.router", app.name),
                    "with [[device]], requests follow the allocator's shares: router = \"weighted\"",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[[app]]
name = "a"
slo_ms = 100
workers = 2
executor = "emulated"
profile = "p.toml"
policy = "fixed"
params = { model = "m" }
"#;

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL, "t.toml", Path::new("/etc/sluice")).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        let app = &c.apps[0];
        assert_eq!(app.router, RouterMode::RoundRobin);
        assert_eq!(app.profile, PathBuf::from("/etc/sluice/p.toml"));
        assert_eq!(app.params_json(Path::new("")).unwrap(), r#"{"model":"m"}"#);
    }

    #[test]
    fn errors_name_file_and_field() {
        let bad = MINIMAL.replace("workers = 2", "workers = 0");
        let e = Config::parse(&bad, "t.toml", Path::new("")).unwrap_err().to_string();
        assert_eq!(e, "t.toml: app.a.workers: expected 1 to 4096 workers");
        let unknown = MINIMAL.replace("workers = 2", "workers = 2\nwokers = 3");
        let e = Config::parse(&unknown, "t.toml", Path::new("")).unwrap_err().to_string();
        assert!(e.starts_with("t.toml: ") && e.contains("wokers"), "{e}");
        let missing = MINIMAL.replace("policy = \"fixed\"", "");
        let e = Config::parse(&missing, "t.toml", Path::new("")).unwrap_err().to_string();
        assert!(e.contains("missing field `policy`"), "{e}");
        let onnx = MINIMAL.replace("\"emulated\"", "\"onnx\"");
        let e = Config::parse(&onnx, "t.toml", Path::new("")).unwrap_err().to_string();
        assert!(e.contains("app.a.model_dir"), "{e}");
    }

    #[test]
    fn the_server_needs_an_executor_and_reads_params_files_beside_the_config() {
        let no_executor = MINIMAL.replace("executor = \"emulated\"\n", "");
        let e = Config::parse(&no_executor, "t.toml", Path::new("")).unwrap_err().to_string();
        assert_eq!(e, "t.toml: app.a.executor: required: \"onnx\" or \"emulated\"");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("params-2.json"), r#"{"table": [[100, "m"]]}"#).unwrap();
        let text = MINIMAL.replace("params = { model = \"m\" }", "params_file = \"params-{workers}.json\"");
        let c = Config::parse(&text, "t.toml", dir.path()).unwrap();
        assert_eq!(c.apps[0].params_json(Path::new("")).unwrap(), r#"{"table": [[100, "m"]]}"#);
    }

    #[test]
    fn embedded_default_parses() {
        let c = Config::embedded_default().unwrap();
        assert_eq!(c.apps[0].name, "imagenet");
        assert_eq!(c.apps[0].executor, Some(ExecutorKind::Onnx));
    }
}
