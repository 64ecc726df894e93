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

pub use sluice_alloc::config::{AllocatorConfig, DeviceConfig, ForecasterKind};
pub use sluice_core::app_config::{AppConfig, ExecutorKind, FailMode, InputSpec};
pub use sluice_core::router::RouterMode;

/// The embedded default: app `imagenet`, the trained ImageNet family
/// (EfficientNet-Lite0/1/2, `models/imagenet-trained`) on the onnx executor, served
/// on 127.0.0.1:8080.
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
    /// `admin_listen = "127.0.0.1:9090"`: serve `/admin` and `/dashboard` (and
    /// `/metrics`) on this address only, e.g. one not reachable from clients
    /// (`--admin-listen` overrides). Without it, they are served on `listen`.
    #[serde(default)]
    pub admin_listen: Option<SocketAddr>,
    /// `grpc_listen = "127.0.0.1:8081"`: also serve the KServe v2 gRPC protocol
    /// (`inference.GRPCInferenceService`, what `tritonclient.grpc` speaks) on this
    /// address (`--grpc-listen` overrides). Off without it.
    #[serde(default)]
    pub grpc_listen: Option<SocketAddr>,
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
    /// `body_budget_bytes = 268435456`: request bodies being read and parsed at once,
    /// in bytes (by their `content-length`); a request that does not fit gets 503
    /// at once, so memory stays bounded under overload.
    #[serde(default = "default_body_budget")]
    pub body_budget_bytes: usize,
    /// `shutdown_grace_ms = 10000`: how long graceful shutdown waits for queues to drain.
    #[serde(default = "default_grace")]
    pub shutdown_grace_ms: u64,
    /// `header_read_timeout_ms = 10000`: a request's head must arrive within this,
    /// or the connection is closed (slow-header clients).
    #[serde(default = "default_header_timeout")]
    pub header_read_timeout_ms: u64,
    /// `body_read_timeout_ms = 30000`: a request's body must arrive within this,
    /// or the request gets 408.
    #[serde(default = "default_body_timeout")]
    pub body_read_timeout_ms: u64,
    /// `idle_timeout_ms = 60000`: a connection with no request in progress that
    /// moves no byte for this long is closed.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_ms: u64,
    /// `max_connections = 1024`: open connections at most; one more is answered
    /// with a 503 naming the limit and closed. Kept below the process's descriptor
    /// limit (lowered, with a warning, when it is not).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// `connection_share = 256`: the connections one client (an IPv4 address, an
    /// IPv6 /64) keeps once `max_connections` are all open. Below the cap any client
    /// may open more; at the cap, a connection from a client holding fewer than its
    /// share takes the slot of an idle connection of the client holding the most,
    /// when that one holds more than its share, and is refused otherwise. Default: a
    /// quarter of `max_connections`, at least 8; 0 turns the fairness off.
    #[serde(default)]
    pub connection_share: Option<usize>,
    /// `arrival_ring = 2000000`: per app, how many of its most recent arrivals the
    /// host keeps for what-if evaluations (`POST /admin/apps/{app}/evaluate`), 8
    /// bytes each, allocated as the ring fills (the default holds 10 minutes at
    /// 3,300 req/s in 16 MB); 0 turns recording off.
    #[serde(default = "default_arrival_ring")]
    pub arrival_ring: usize,
    /// `evaluations_kept = 32`: finished what-if evaluations kept for
    /// `GET /admin/evaluations/{id}`; the oldest finished one is forgotten first.
    #[serde(default = "default_evaluations_kept")]
    pub evaluations_kept: usize,
    /// `evaluation_threads = 1`: threads one evaluation replays on: 1 replays the
    /// candidate and then the current policy, 2 uses two cores (about half the wall
    /// time, at the cost of a second core taken from the serving workers
    /// meanwhile): each replay split by worker where the router allows, else the
    /// two replays at once (`sluice_core::whatif::compare`).
    #[serde(default = "default_evaluation_threads")]
    pub evaluation_threads: usize,
    /// `[[app]]`: the served applications.
    #[serde(rename = "app", default)]
    pub apps: Vec<AppConfig>,
    /// `[[device]]`: devices the MILP allocator places the apps' variants on (see
    /// [`DeviceConfig`]); with them, every app has one worker per device and routes
    /// by the plan's shares.
    #[serde(rename = "device", default)]
    pub devices: Vec<DeviceConfig>,
    /// `[allocator]`: how plans are made (defaults without the table).
    #[serde(default)]
    pub allocator: AllocatorConfig,
    /// `[[pipeline]]`: served pipelines (Loki): apps whose requests go through a tree
    /// of tasks, each with its own workers, placed and routed by Loki's allocator.
    #[serde(rename = "pipeline", default)]
    pub pipelines: Vec<PipelineConfig>,
}

/// One served pipeline. Its graph, profile, SLO, worker count and first demand come
/// from a Loki problem file (`sluice allocate --problem` solves the same file to the
/// same plan); the rest says how the host serves it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// `name = "traffic"`: the app name clients send requests to; each task runs as
    /// the internal app `<name>.<task>` (its policy is swapped like any app's).
    pub name: String,
    /// `problem = "allocate/loki-traffic.toml"`: the Loki problem file.
    pub problem: PathBuf,
    /// `executor = "emulated"` or `"onnx"`.
    pub executor: ExecutorKind,
    /// `model_dir = "../models/imagenet"`: where the onnx executor finds the variants.
    #[serde(default)]
    pub model_dir: Option<PathBuf>,
    /// `input = { name = "input", datatype = "FP32", shape = [4] }`: the request's
    /// tensor (default: the root variants' input on onnx; required when emulated).
    /// Every task receives it: a task's intermediate requests carry the client's
    /// input on (the fan-out stands in for the crops a detector would make).
    #[serde(default)]
    pub input: Option<InputSpec>,
    /// What it shares with a simulated pipeline's `[pipeline.system]`: `policy`
    /// (default `fixed`) and `params` (default `{ allocated = true }`: the variant the
    /// plan loaded on each worker, batches sized to the request's task budget),
    /// `early_drop` and `early_drop_at` (`hop`, or `batch`: also at a worker's queue
    /// when it forms a batch, the reference's `pop_while_first_expires`;
    /// docs/allocator.md), `root_dispatch` (`table`, the paper's Algorithm 1, or
    /// `queue-aware`, what the Loki artifact's executor runs), `root_budget`
    /// (`batch` or `slo-per-stage`), `routing_utilization` (in (0, 1], default 1),
    /// `beta` (replacing the problem file's `[ladder] beta`; the Loki experiments use
    /// 1.2 with `routing_utilization = 0.8`) and `min_demand_qps` (default 1). Keys of
    /// the `[[pipeline]]` table, as before (flattened).
    #[serde(flatten)]
    pub serving: sluice_core::pipeline::Serving,
    /// `max_queue = 4096`: client requests in the pipeline at once; beyond it, 429.
    #[serde(default = "default_pipeline_queue")]
    pub max_queue: usize,
    /// `routing_period_ms = 1000`: routing tables are rebuilt this often from the
    /// measured demand (the plan stays).
    #[serde(default = "default_routing_period")]
    pub routing_period_ms: u64,
    /// `replan_period_s = 10`: the MILP is re-solved this often (0: only at startup
    /// and on `POST /admin/pipelines/{name}/solve`), and early when the measured
    /// demand moves more than `replan_threshold` from the plan's.
    #[serde(default = "default_replan_period")]
    pub replan_period_s: f64,
    /// `replan_threshold = 0.2`.
    #[serde(default = "default_replan_threshold")]
    pub replan_threshold: f64,
    /// `scale_down_window_s = 60`: re-plans and routing tables follow the peak of the
    /// demand measured over this window, so demand that rises is planned for at once
    /// and demand that falls only after the window (Kubernetes's HPA waits 300 s
    /// before it scales down). 0 follows each measurement (the paper's rule), which
    /// re-plans an idle pipeline for `min_demand_qps` and overloads it when traffic
    /// resumes. At most 3600.
    #[serde(default = "default_scale_down_window")]
    pub scale_down_window_s: f64,
}

fn default_pipeline_queue() -> usize {
    4096
}
fn default_routing_period() -> u64 {
    1000
}
fn default_replan_period() -> f64 {
    10.0
}
fn default_replan_threshold() -> f64 {
    0.2
}
fn default_scale_down_window() -> f64 {
    60.0
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
fn default_body_budget() -> usize {
    256 << 20
}
fn default_header_timeout() -> u64 {
    10_000
}
fn default_body_timeout() -> u64 {
    30_000
}
fn default_idle_timeout() -> u64 {
    60_000
}
fn default_max_connections() -> usize {
    1024
}
fn default_arrival_ring() -> usize {
    2_000_000
}
fn default_evaluations_kept() -> usize {
    32
}
fn default_evaluation_threads() -> usize {
    1
}

/// The largest `arrival_ring`: 2 GiB of arrival times per app.
pub const MAX_ARRIVAL_RING: usize = 1 << 28;

/// The most ONNX Runtime intra-op threads per session (`intra_threads`, 1 to 256):
/// each worker's session starts its own, so more than the machine's cores only
/// contend; 100,000 hung start-up.
pub const MAX_INTRA_THREADS: usize = 256;

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
        config.allocator.rebase(base);
        for p in &mut config.pipelines {
            rebase(&mut p.problem);
            if let Some(d) = p.model_dir.as_mut() {
                rebase(d);
            }
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
        if self.apps.is_empty() && self.pipelines.is_empty() {
            return Err(invalid("app".into(), "at least one [[app]] or [[pipeline]] is required"));
        }
        for (field, value) in [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("max_connections", self.max_connections as u64),
            ("body_budget_bytes", self.body_budget_bytes as u64),
        ] {
            if value == 0 {
                return Err(invalid(field.into(), "expected at least 1"));
            }
        }
        if self.arrival_ring > MAX_ARRIVAL_RING {
            return Err(invalid(
                "arrival_ring".into(),
                &format!("expected 0 (off) to {MAX_ARRIVAL_RING} arrivals (8 bytes each)"),
            ));
        }
        if !(1..=10_000).contains(&self.evaluations_kept) {
            return Err(invalid("evaluations_kept".into(), "expected 1 to 10000"));
        }
        if !(1..=2).contains(&self.evaluation_threads) {
            return Err(invalid("evaluation_threads".into(), "expected 1 or 2"));
        }
        if self.body_budget_bytes < self.max_body_bytes {
            return Err(invalid("body_budget_bytes".into(), "must be at least max_body_bytes (one largest body)"));
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
            if !app.mixed_families {
                check_families(app).map_err(|e| invalid(format!("app.{}.models", app.name), &e.to_string()))?;
            }
            // ONNX Runtime starts this many threads per session, per worker: 100,000
            // hung start-up for minutes without a word.
            if !(1..=MAX_INTRA_THREADS).contains(&app.intra_threads) {
                return Err(invalid(
                    format!("app.{}.intra_threads", app.name),
                    &format!("expected 1 to {MAX_INTRA_THREADS} threads"),
                ));
            }
        }
        for p in &self.pipelines {
            let field = |f: &str| format!("pipeline.{}.{f}", p.name);
            if p.name.is_empty() || !p.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)) {
                return Err(invalid(field("name"), "expected letters, digits, '-' and '_'"));
            }
            if seen.insert(p.name.clone(), ()).is_some() {
                return Err(invalid(field("name"), "an app or pipeline of that name already exists"));
            }
            if let Some(app) = self.apps.iter().find(|a| a.name.starts_with(&format!("{}.", p.name))) {
                return Err(invalid(
                    field("name"),
                    &format!("app `{}` would clash with the pipeline's task apps `{}.<task>`", app.name, p.name),
                ));
            }
            if p.executor == ExecutorKind::Onnx && p.model_dir.is_none() {
                return Err(invalid(field("model_dir"), "required with executor = \"onnx\""));
            }
            if p.max_queue == 0 {
                return Err(invalid(field("max_queue"), "expected at least 1"));
            }
            if p.routing_period_ms == 0 {
                return Err(invalid(field("routing_period_ms"), "expected at least 1 ms"));
            }
            if !(p.serving.routing_utilization > 0.0 && p.serving.routing_utilization <= 1.0) {
                return Err(invalid(field("routing_utilization"), "expected a share in (0, 1]"));
            }
            if p.serving.beta.is_some_and(|b| !(b.is_finite() && b > 0.0 && b <= 10.0)) {
                return Err(invalid(field("beta"), "expected a demand factor in (0, 10]"));
            }
            for (name, v) in [
                ("replan_period_s", p.replan_period_s),
                ("replan_threshold", p.replan_threshold),
                ("min_demand_qps", p.serving.min_demand_qps),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(invalid(field(name), "expected a non-negative number"));
                }
            }
            if !(p.scale_down_window_s.is_finite() && (0.0..=3600.0).contains(&p.scale_down_window_s)) {
                return Err(invalid(field("scale_down_window_s"), "expected seconds in [0, 3600]"));
            }
        }
        if self.apps.is_empty() {
            return Ok(());
        }
        self.validate_devices(file)
    }

    fn validate_devices(&self, file: &str) -> Result<(), ConfigError> {
        sluice_alloc::config::validate(&self.apps, &self.devices, &self.allocator)
            .map_err(|e| ConfigError::invalid(file, e.field, e.message))
    }
}

/// Refuses an app whose variants come from unrelated families (an app serves one
/// task: the allocator, maximising accuracy, moved all of an image app's traffic to
/// yolov5x when it was given all 46 variants of Proteus's profile, issue 34). A
/// variant's family is the one its profile's `accuracy_source` names in Proteus's
/// words ("... the resnet family's accuracy as % of its best variant"); variants
/// that name none are not compared (the trained EfficientNet-Lite profile says
/// "the family's input size", which names no family). A profile that cannot be read is left to the app's build,
/// which says why.
fn check_families(app: &sluice_core::app_config::AppConfig) -> Result<(), MixedFamilies> {
    let Ok(profile) = sluice_core::profile::Profile::load(&app.profile) else { return Ok(()) };
    let listed = |name: &str| app.models.as_ref().is_none_or(|m| m.iter().any(|x| x == name));
    let families: std::collections::BTreeSet<&str> = profile
        .models
        .iter()
        .filter(|m| listed(&m.name))
        .filter_map(|m| {
            let s = m.accuracy_source.as_str();
            let (before, family) = s[..s.find(" family's accuracy")?].rsplit_once(' ')?;
            let named = before.rsplit(' ').next() == Some("the") && !family.is_empty() && family != "the";
            named.then_some(family)
        })
        .collect();
    if families.len() <= 1 {
        return Ok(());
    }
    Err(MixedFamilies { listed: app.models.is_some(), families: families.into_iter().map(String::from).collect() })
}

/// An app whose variants span several families ([`check_families`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "{} span the families {}: an app serves one task; list one family's models, or set mixed_families = true",
    if *.listed { "its models" } else { "without `models`, every variant of its profile" },
    .families.join(", ")
)]
struct MixedFamilies {
    /// Whether the app lists its `models` (or takes every variant of its profile).
    listed: bool,
    /// The families, in order.
    families: Vec<String>,
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

    /// The keys a `[[pipeline]]` shares with a simulated `[pipeline.system]`
    /// (`sluice_core::pipeline::Serving`, flattened) stay keys of the table, and a
    /// key neither knows is still refused.
    #[test]
    fn pipeline_keys_shared_with_the_simulator_stay_in_the_table() {
        let text = "[[pipeline]]\nname = \"p\"\nproblem = \"p.toml\"\nexecutor = \"emulated\"\nearly_drop = \"per-task\"\nrouting_utilization = 0.8\nbeta = 1.2\nmax_queue = 7\n";
        let c = Config::parse(text, "t.toml", Path::new("")).unwrap();
        let p = &c.pipelines[0];
        assert_eq!(p.serving.early_drop, sluice_core::pipeline::EarlyDrop::PerTask);
        assert_eq!((p.serving.routing_utilization, p.serving.beta, p.max_queue), (0.8, Some(1.2), 7));
        assert_eq!((p.serving.policy.as_str(), p.serving.min_demand_qps), ("fixed", 1.0));
        let e = Config::parse(&format!("{text}erly_drop = \"none\"\n"), "t.toml", Path::new("")).unwrap_err();
        assert!(e.to_string().contains("unknown field `erly_drop`"), "{e}");
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
    fn an_app_of_unrelated_families_is_refused_unless_it_says_so() {
        let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../profiles/proteus-cpu.toml");
        let app = |extra: &str| {
            MINIMAL.replace("profile = \"p.toml\"", &format!("profile = {:?}\n{extra}", profile.display().to_string()))
        };
        let e = Config::parse(&app("models = [\"resnet50_v1\", \"yolov5x\"]"), "t.toml", Path::new(""))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "t.toml: app.a.models: its models span the families resnet, yolo: an app serves one task; \
             list one family's models, or set mixed_families = true"
        );
        let e = Config::parse(&app(""), "t.toml", Path::new("")).unwrap_err().to_string();
        assert!(e.contains("every variant of its profile span the families bert, densenet"), "{e}");
        Config::parse(&app("models = [\"resnet50_v1\", \"resnet18_v1\"]"), "t.toml", Path::new("")).unwrap();
        Config::parse(&app("models = [\"resnet50_v1\", \"yolov5x\"]\nmixed_families = true"), "t.toml", Path::new(""))
            .unwrap();
    }

    #[test]
    fn embedded_default_parses() {
        let c = Config::embedded_default().unwrap();
        assert_eq!(c.apps[0].name, "imagenet");
        assert_eq!(c.apps[0].executor, Some(ExecutorKind::Onnx));
        // From the repository root, where its profile is read and its families
        // checked: one family, although the profile's text says "the family's input".
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        Config::parse(DEFAULT_CONFIG, "<embedded default config>", &root).unwrap();
        for name in ["imagenet-light-cpu.toml", "imagenet-trained-cpu.toml", "proteus-cpu.toml"] {
            assert!(root.join("profiles").join(name).exists(), "{name}");
        }
    }
}

/// Property-based fuzzing of config and profile parsing: the repository's own
/// configs and profiles are the seeds, mutated line by line. No text panics either
/// parser; every refusal names its file.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn seeds(dirs: &[&str]) -> Vec<String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut out = Vec::new();
        for d in dirs {
            for e in std::fs::read_dir(root.join(d)).expect("seed directory").flatten() {
                if e.path().extension().is_some_and(|x| x == "toml") {
                    out.push(std::fs::read_to_string(e.path()).expect("a seed"));
                }
            }
        }
        out.sort();
        assert!(!out.is_empty());
        out
    }

    /// Values that have broken parsers: wrong types, extremes, empty.
    const TOKENS: &[&str] = &[
        "0",
        "-1",
        "1e400",
        "nan",
        "inf",
        "\"\"",
        "[]",
        "{}",
        "18446744073709551616",
        "\"../../../etc/passwd\"",
        "[[app]]",
        "true",
        "\"\\u0000\"",
        "0.0",
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]",
    ];

    /// Deletes, duplicates or swaps a line, or replaces the value after a `=`.
    fn mutate(text: &str, ops: &[(u8, usize, u8)]) -> String {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        for &(op, at, pick) in ops {
            if lines.is_empty() {
                break;
            }
            let at = at % lines.len();
            match op % 4 {
                0 => {
                    lines.remove(at);
                }
                1 => {
                    let l = lines[at].clone();
                    lines.insert(at, l);
                }
                2 => {
                    let other = (at + pick as usize) % lines.len();
                    lines.swap(at, other);
                }
                _ => {
                    if let Some((key, _)) = lines[at].split_once('=') {
                        lines[at] = format!("{key}= {}", TOKENS[pick as usize % TOKENS.len()]);
                    }
                }
            }
        }
        lines.join("\n")
    }

    proptest! {
        #[test]
        fn no_config_panics_the_parser(
            seed in any::<prop::sample::Index>(),
            ops in prop::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 0..6),
        ) {
            let seeds = seeds(&["examples"]);
            let text = mutate(&seeds[seed.index(seeds.len())], &ops);
            if let Err(e) = Config::parse(&text, "fuzz.toml", Path::new("/nonexistent")) {
                prop_assert!(e.to_string().contains("fuzz.toml"), "{e}");
            }
        }

        #[test]
        fn no_profile_panics_the_parser(
            seed in any::<prop::sample::Index>(),
            ops in prop::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 0..6),
        ) {
            let seeds = seeds(&["profiles", "examples/profiles"]);
            let text = mutate(&seeds[seed.index(seeds.len())], &ops);
            if let Err(e) = sluice_core::profile::Profile::parse(&text, "fuzz-profile.toml") {
                prop_assert!(e.to_string().contains("fuzz-profile.toml"), "{e}");
            }
        }
    }
}
