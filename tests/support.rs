//! Shared support for the end-to-end tests: start a real sluice server on
//! `127.0.0.1:0` in-process, with emulated or ONNX apps, and talk to it over HTTP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sluice_loadgen::{Client, HttpResponse};
use sluice_server::state::State;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The admin token every test server uses.
pub const TOKEN: &str = "test-token";

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the workspace").to_path_buf()
}

/// Where `cargo xtask policies` puts the test fixtures (not built-ins: the tests
/// upload them); fails clearly when they are missing.
pub fn fixtures_dir() -> PathBuf {
    let dir = root().join("target/fixtures");
    assert!(
        dir.join("misbehave.wasm").exists(),
        "{}/misbehave.wasm is missing: run `cargo xtask policies` (cargo xtask test does)",
        dir.display()
    );
    dir
}

/// Where `cargo xtask policies` puts the components; fails clearly when they are missing.
pub fn policies_dir() -> PathBuf {
    let dir = root().join("target/policies");
    for name in ["jellyfish", "fixed"] {
        assert!(
            dir.join(format!("{name}.wasm")).exists(),
            "{}/{name}.wasm is missing: run `cargo xtask policies` (cargo xtask test does)",
            dir.display()
        );
    }
    dir
}

/// An emulated profile with three models (µs at batch 1..=8): fast/low accuracy to
/// slow/high accuracy. `scale` multiplies every latency (0 gives zero-latency models).
pub fn emulated_profile(scale: f64) -> String {
    sluice_core::profile::synthetic_emulated("test-emulated", "synthetic, for tests", scale)
}

/// A running test server.
pub struct TestServer {
    /// Its address.
    pub addr: SocketAddr,
    /// Its gRPC address ([`TestServer::start_with_grpc`]).
    pub grpc: Option<SocketAddr>,
    /// Its state (apps, counters).
    pub state: Arc<State>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<()>>>,
    /// Keeps the temporary directory alive.
    pub dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts a server from config text (`{dir}` is replaced by a fresh temp dir holding
    /// `emulated.toml`, a 1×-latency emulated profile, and `zero.toml`, a zero-latency one).
    pub async fn start(config: &str) -> Result<TestServer> {
        Self::start_with_policy_dir(config, None).await
    }

    /// As [`TestServer::start`], keeping uploaded policies in `policy_dir` (to test
    /// that they survive a restart) instead of the temp dir.
    pub async fn start_with_policy_dir(config: &str, policy_dir: Option<&Path>) -> Result<TestServer> {
        Self::start_inner(config, policy_dir, false).await
    }

    /// As [`TestServer::start`], serving the KServe v2 gRPC protocol too (on
    /// `grpc`, another `127.0.0.1:0` port).
    pub async fn start_with_grpc(config: &str) -> Result<TestServer> {
        Self::start_inner(config, None, true).await
    }

    async fn start_inner(config: &str, policy_dir: Option<&Path>, grpc: bool) -> Result<TestServer> {
        let dir = tempfile::tempdir()?;
        let policy_dir = policy_dir.map(Path::to_path_buf).unwrap_or_else(|| dir.path().join("policies"));
        std::fs::write(dir.path().join("emulated.toml"), emulated_profile(1.0))?;
        std::fs::write(dir.path().join("zero.toml"), emulated_profile(0.0))?;
        // A config may set its own grace (top-level keys come before any table).
        let grace = if config.contains("shutdown_grace_ms") { "" } else { "shutdown_grace_ms = 5000\n" };
        let text = format!(
            "admin_token = \"{TOKEN}\"\npolicy_dir = \"{}\"\nbuiltin_policy_dir = \"{}\"\n{grace}{}",
            policy_dir.display(),
            policies_dir().display(),
            config.replace("{dir}", &dir.path().display().to_string()).replace("{root}", &root().display().to_string())
        );
        let mut config = sluice_server::config::Config::parse(&text, "test config", dir.path())?;
        if grpc {
            config.grpc_listen = Some("127.0.0.1:0".parse()?);
        }
        Self::serve(config, dir).await
    }

    /// Builds and serves an already parsed config on `127.0.0.1:0` (and gRPC on its
    /// `grpc_listen`, if set); `dir` is kept alive with the server.
    pub async fn serve(config: sluice_server::config::Config, dir: tempfile::TempDir) -> Result<TestServer> {
        let grpc = match config.grpc_listen {
            Some(a) => Some(tokio::net::TcpListener::bind(a).await?),
            None => None,
        };
        let state = State::build(config).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let grpc_addr = grpc.as_ref().map(|l| l.local_addr()).transpose()?;
        let (tx, rx) = oneshot::channel::<()>();
        let s = state.clone();
        let task = tokio::spawn(async move {
            let listeners = sluice_server::server::Listeners { main: listener, admin: None, grpc };
            sluice_server::server::run_listeners(listeners, s, async {
                let _ = rx.await;
            })
            .await
        });
        Ok(TestServer { addr, grpc: grpc_addr, state, shutdown: Some(tx), task: Some(task), dir })
    }

    /// A new client connection.
    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await.expect("connect to the test server")
    }

    /// Shuts down gracefully and waits for the server to finish draining.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.context("server task")??;
        }
        Ok(())
    }
}

/// `PUT`/`GET`/`POST` with the admin token.
pub async fn admin(c: &mut Client, method: &str, path: &str, body: &[u8]) -> HttpResponse {
    let auth = format!("Bearer {TOKEN}");
    c.request(method, path, &[("authorization", &auth), ("content-type", "application/json")], body)
        .await
        .expect("admin request")
}

/// Uploads a policy component as `name`; returns the response.
pub async fn upload(c: &mut Client, name: &str, bytes: &[u8]) -> HttpResponse {
    let auth = format!("Bearer {TOKEN}");
    c.request(
        "POST",
        &format!("/admin/policies?name={name}"),
        &[("authorization", &auth), ("content-type", "application/wasm")],
        bytes,
    )
    .await
    .expect("upload request")
}

/// Swaps `app`'s policy; returns the response.
pub async fn swap(c: &mut Client, app: &str, policy: &str, params: Value) -> HttpResponse {
    let body = json!({ "policy": policy, "params": params }).to_string();
    admin(c, "PUT", &format!("/admin/apps/{app}/policy"), body.as_bytes()).await
}

/// An inference body for an emulated app whose input is `x`, FP32, shape [4].
pub fn small_infer(id: u64) -> Value {
    json!({ "id": id.to_string(), "inputs": [{ "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, id as f64] }] })
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub async fn eventually<F: FnMut() -> bool>(timeout: Duration, mut cond: F) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// The app's status from the admin API.
pub async fn app_status(c: &mut Client, app: &str) -> Value {
    admin(c, "GET", &format!("/admin/apps/{app}"), b"").await.json()
}

/// One emulated app called `emu` (input `x`, FP32, shape [4]) on `profile`
/// (`emulated` or `zero`), followed by `extra` TOML lines (workers, policy, ...).
pub fn emu_app(profile: &str, extra: &str) -> String {
    format!(
        "[[app]]\nname = \"emu\"\nexecutor = \"emulated\"\nprofile = \"{{dir}}/{profile}.toml\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\n{extra}\n"
    )
}

/// Sends `n` requests to `emu` at once, one connection each, and returns the responses.
pub async fn burst(addr: SocketAddr, n: u64) -> Vec<HttpResponse> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        tasks.spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            c.post_json("/v2/models/emu/infer", &small_infer(i)).await.unwrap()
        });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r.unwrap());
    }
    out
}

/// Two emulated apps, `a` and `b` (jellyfish, 4 workers, weighted routing), on
/// four devices of two types that the allocator plans for 100 and 20 req/s.
pub fn two_apps_on_four_devices() -> String {
    let app = |name: &str| {
        format!(
            "[[app]]\nname = \"{name}\"\nexecutor = \"emulated\"\nprofile = \"{{dir}}/emulated.toml\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\nslo_ms = 100\nworkers = 4\nrouter = \"weighted\"\npolicy = \"jellyfish\"\n"
        )
    };
    format!(
        "[[device]]\ntype = \"cpu\"\ncount = 2\nprofile = \"{{dir}}/emulated.toml\"\n\n[[device]]\ntype = \"gpu\"\ncount = 2\nprofile = \"{{dir}}/emulated.toml\"\n\n[allocator]\ndemand_qps = {{ a = 100, b = 20 }}\n\n{}\n{}",
        app("a"),
        app("b")
    )
}
