//! A cluster of real processes on loopback: a local etcd cluster, and `sluice serve
//! --role ...` agents, frontends and allocators, each a child process with its log
//! in the cluster's directory. The cluster tests, `cargo xtask cluster-demo` and the
//! cluster benchmark drive it; [`drive`] sends bounded load and accounts for every
//! request (each answered exactly once, or counted lost).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::Mutex;

use crate::etcd_process::EtcdCluster;
use crate::keys::{decode, AgentRecord, FrontendRecord, Keys, RoutingTable};
use crate::netns::NetNs;
use crate::store::{EtcdStore, Store};

/// A synthetic emulated profile (three variants, latency growing with the batch),
/// `scale` × 1 ms for `small` at batch 1.
pub fn emulated_profile(scale: f64) -> String {
    sluice_core::profile::synthetic_emulated("cluster-emulated", "synthetic", scale)
}

/// A config for every role: one app `img` (emulated, `slo_ms`), `max_devices` cpu
/// devices (the frontends' slots per app), the built-in policies from `policies`;
/// idle devices get a replica (`spare = "replicate"`), so every variant in use has a
/// second device to fail over to.
pub fn config_text(dir: &Path, policies: &Path, max_devices: u32, slo_ms: u32, demand_qps: f64) -> String {
    format!(
        "builtin_policy_dir = \"{policies}\"\npolicy_dir = \"{dir}/uploaded\"\nshutdown_grace_ms = 3000\n\n\
         [[device]]\ntype = \"cpu\"\ncount = {max_devices}\nprofile = \"{dir}/emulated.toml\"\n\n\
         [allocator]\ndemand_qps = {{ img = {demand_qps} }}\nperiod_s = 2\nthreshold = 0.5\nspare = \"replicate\"\n\n\
         [[app]]\nname = \"img\"\nexecutor = \"emulated\"\nprofile = \"{dir}/emulated.toml\"\n\
         input = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\nslo_ms = {slo_ms}\nworkers = {max_devices}\n\
         router = \"weighted\"\npolicy = \"jellyfish\"\nmax_queue = 10000\n",
        policies = policies.display(),
        dir = dir.display(),
    )
}

/// One role's process.
pub struct Proc {
    /// `agent`, `frontend` or `allocator`.
    pub role: String,
    /// Its id.
    pub id: String,
    /// Its listen address (agents and frontends).
    pub addr: Option<SocketAddr>,
    child: Child,
    /// Its log file.
    pub log: PathBuf,
}

/// A cluster of processes (see the module docs).
pub struct Cluster {
    /// Its directory (config, profile, logs, etcd data).
    pub dir: PathBuf,
    /// The `sluice` binary.
    pub bin: PathBuf,
    /// The etcd cluster.
    pub etcd: EtcdCluster,
    /// The config every role reads.
    pub config: PathBuf,
    /// The processes, by id.
    pub procs: BTreeMap<String, Proc>,
    /// A store client (for reading what the roles published).
    pub store: Arc<dyn Store>,
    /// The key layout.
    pub keys: Keys,
}

impl Cluster {
    /// Starts an etcd cluster of `etcd_members` under `dir` and writes `config` there
    /// (with `emulated.toml`).
    pub async fn start(bin: &Path, dir: &Path, etcd_members: usize, config: &str) -> anyhow::Result<Cluster> {
        Self::start_on(bin, dir, etcd_members, config, &[]).await
    }

    /// As [`Cluster::start`], etcd also serving on each address of `also_on` (the
    /// host ends of the namespaces that roles will run in: [`Cluster::agent_on`]).
    pub async fn start_on(
        bin: &Path,
        dir: &Path,
        etcd_members: usize,
        config: &str,
        also_on: &[std::net::IpAddr],
    ) -> anyhow::Result<Cluster> {
        anyhow::ensure!(
            bin.exists(),
            "the sluice binary is not at {} (cargo build --release -p sluice)",
            bin.display()
        );
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("emulated.toml"), emulated_profile(1.0))?;
        let path = dir.join("cluster.toml");
        std::fs::write(&path, config)?;
        let etcd = EtcdCluster::start_on(dir, etcd_members, also_on).await?;
        let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(&etcd.endpoints()).await?);
        Ok(Cluster {
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
            etcd,
            config: path,
            procs: BTreeMap::new(),
            store,
            keys: Keys::default(),
        })
    }

    fn spawn(
        &mut self,
        role: &str,
        id: &str,
        extra: &[&str],
        wait_line: Option<&str>,
        ns: Option<&NetNs>,
    ) -> anyhow::Result<()> {
        let log = self.dir.join(format!("{id}.log"));
        // A process in a namespace reaches etcd through the namespace's pair.
        let (mut command, etcd) = match ns {
            Some(ns) => (ns.command(&self.bin), self.etcd.endpoints_on(ns.host_ip.into())),
            None => (Command::new(&self.bin), self.etcd.endpoints()),
        };
        anyhow::ensure!(!etcd.is_empty(), "{role} {id}: etcd does not serve the namespace (Cluster::start_on)");
        let mut child = command
            .args(["serve", "--config"])
            .arg(&self.config)
            .args(["--role", role, "--id", id, "--etcd", &etcd.join(","), "--lease-ttl", "2"])
            .args(extra)
            .env("RUST_LOG", std::env::var("SLUICE_CLUSTER_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let mut addr = None;
        if let Some(prefix) = wait_line {
            // The address is on the first line of stdout.
            let mut out = BufReader::new(child.stdout.take().expect("piped"));
            let mut line = String::new();
            out.read_line(&mut line)?;
            let a = line
                .trim()
                .strip_prefix(prefix)
                .and_then(|rest| rest.rsplit("http://").next())
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{role} {id}: expected `{prefix} ... http://ADDR` on stdout, got {line:?} (log: {})",
                        log.display()
                    )
                })?;
            addr = Some(a);
            // Keep draining stdout so the child never blocks on a full pipe.
            std::thread::spawn(move || for _ in out.lines() {});
        }
        self.procs.insert(id.to_string(), Proc { role: role.into(), id: id.into(), addr, child, log });
        Ok(())
    }

    /// Starts an allocator.
    pub fn allocator(&mut self, id: &str) -> anyhow::Result<()> {
        self.spawn("allocator", id, &[], None, None)
    }

    /// Starts an agent with `devices` cpu devices on loopback; returns its address.
    pub fn agent(&mut self, id: &str, devices: usize) -> anyhow::Result<SocketAddr> {
        self.agent_on(id, devices, std::net::Ipv4Addr::LOCALHOST.into(), None)
    }

    /// Starts an agent with `devices` cpu devices listening on `ip`, in namespace
    /// `ns` if given (`ip` is then its end, `ns.ns_ip`); returns its address.
    pub fn agent_on(
        &mut self,
        id: &str,
        devices: usize,
        ip: std::net::IpAddr,
        ns: Option<&NetNs>,
    ) -> anyhow::Result<SocketAddr> {
        let d = vec!["cpu"; devices].join(",");
        let listen = SocketAddr::new(ip, 0).to_string();
        self.spawn("agent", id, &["--listen", &listen, "--devices", &d], Some(&format!("sluice agent {id}")), ns)?;
        Ok(self.procs[id].addr.expect("an agent has an address"))
    }

    /// Starts a frontend on loopback; returns its address (it serves once the first
    /// routing table is in: see [`Cluster::wait_ready`]).
    pub fn frontend(&mut self, id: &str, batch_timeout_ms: u64) -> anyhow::Result<SocketAddr> {
        self.frontend_on(id, batch_timeout_ms, std::net::Ipv4Addr::LOCALHOST.into(), None)
    }

    /// As [`Cluster::frontend`], listening on `ip`, in namespace `ns` if given.
    pub fn frontend_on(
        &mut self,
        id: &str,
        batch_timeout_ms: u64,
        ip: std::net::IpAddr,
        ns: Option<&NetNs>,
    ) -> anyhow::Result<SocketAddr> {
        let t = batch_timeout_ms.to_string();
        let listen = SocketAddr::new(ip, 0).to_string();
        self.spawn(
            "frontend",
            id,
            &["--listen", &listen, "--batch-timeout-ms", &t],
            Some(&format!("sluice frontend {id}")),
            ns,
        )?;
        Ok(self.procs[id].addr.expect("a frontend has an address"))
    }

    /// Waits until the frontend at `addr` answers ready (at most `within`).
    pub async fn wait_ready(&self, addr: SocketAddr, within: Duration) -> anyhow::Result<()> {
        wait_for(within, &format!("{addr} not ready"), || async {
            let mut c = sluice_loadgen::Client::connect(addr).await.ok()?;
            let r = c.get("/v2/health/ready").await.ok()?;
            (r.status == 200).then_some(())
        })
        .await
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to a process.
    pub fn signal(&mut self, id: &str, signal: &str) -> anyhow::Result<()> {
        let p = self.procs.get_mut(id).ok_or_else(|| anyhow::anyhow!("no process {id}"))?;
        let pid = p.child.id().to_string();
        let ok = Command::new("kill").args([&format!("-{signal}"), &pid]).status()?.success();
        anyhow::ensure!(ok, "kill -{signal} {pid} failed");
        if signal == "KILL" {
            let _ = p.child.wait();
        }
        Ok(())
    }

    /// Waits for a process to exit (after a TERM), at most `within`; true if it did.
    pub fn wait_exit(&mut self, id: &str, within: Duration) -> bool {
        let Some(p) = self.procs.get_mut(id) else { return true };
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = p.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The routing table in force (None: none yet, or unreadable).
    pub async fn routing(&self) -> Option<RoutingTable> {
        let key = self.keys.routing();
        let kv = retry(|| self.store.get(&key)).await.ok()??;
        decode(&kv.key, &kv.value).ok()
    }

    /// The agents registered now.
    pub async fn agents(&self) -> Vec<AgentRecord> {
        self.records(&self.keys.agents()).await
    }

    /// The frontends' records now (each says which routing epoch it serves on).
    pub async fn frontends(&self) -> Vec<FrontendRecord> {
        self.records(&self.keys.frontends()).await
    }

    async fn records<T: for<'de> serde::Deserialize<'de>>(&self, prefix: &str) -> Vec<T> {
        match retry(|| self.store.list(prefix)).await {
            Ok(l) => l.kvs.iter().filter_map(|kv| decode(&kv.key, &kv.value).ok()).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The id of the allocator that leads now (None: none does).
    pub async fn leading_allocator(&self) -> anyhow::Result<Option<String>> {
        let key = self.keys.election();
        let kv = retry(|| self.store.get(&key)).await?;
        Ok(kv.map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }

    /// Compacts etcd at its current revision (watches from before it get a
    /// compaction error); returns the revision.
    pub async fn compact_now(&self) -> anyhow::Result<i64> {
        let key = self.keys.routing();
        let revision = retry(|| self.store.list(&key)).await?.revision;
        retry(|| self.store.compact(revision)).await?;
        Ok(revision)
    }

    /// Polls the routing table until `f` holds (at most `within`).
    pub async fn wait_routing(
        &self,
        within: Duration,
        f: impl Fn(&RoutingTable) -> bool,
    ) -> anyhow::Result<RoutingTable> {
        wait_for(within, "the routing table did not reach the expected state", || async {
            self.routing().await.filter(|t| f(t))
        })
        .await
    }

    /// Asks the leading allocator to re-plan now.
    pub async fn ask_replan(&self) -> anyhow::Result<()> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
        let key = self.keys.replan();
        retry(|| self.store.put(&key, now.to_string().into_bytes(), None)).await?;
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.procs.values_mut() {
            // A stopped process must be continued before it can die of SIGKILL's
            // exit path reliably report; kill works on stopped processes anyway.
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// Polls `f` every 100 ms until it gives a value, for at most `within`; the error
/// says `what` did not happen within it.
pub async fn wait_for<T, F, Fut>(within: Duration, what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a store call, again on `Unavailable` (a member just killed, a connection
/// the keep-alive just gave up on: the roles ride these out the same way), up to
/// 10 tries 300 ms apart.
async fn retry<T, F, Fut>(call: F) -> Result<T, crate::store::StoreError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::store::StoreError>>,
{
    let mut tries = 0;
    loop {
        match call().await {
            Err(crate::store::StoreError::Unavailable(_)) if tries < 9 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            other => return other,
        }
    }
}

/// What a load run saw.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// Requests sent.
    pub sent: u64,
    /// Answers by HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests with no answer (the connection failed before one came).
    pub lost: u64,
    /// Served requests by the variant that served them.
    pub variants: BTreeMap<String, u64>,
    /// The first few non-2xx answers' bodies (what they said).
    pub errors: Vec<String>,
    /// Latencies of the 200s, µs.
    pub latencies_us: Vec<u64>,
}

impl LoadReport {
    /// Requests answered (any status).
    pub fn answered(&self) -> u64 {
        self.statuses.values().sum()
    }

    /// Answers with this status.
    pub fn count(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }

    /// The `q` quantile of the 200s' latency, µs.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        if v.is_empty() {
            return 0;
        }
        v[((v.len() - 1) as f64 * q).round() as usize]
    }

    fn merge(&mut self, o: LoadReport) {
        self.sent += o.sent;
        self.lost += o.lost;
        for (k, v) in o.statuses {
            *self.statuses.entry(k).or_default() += v;
        }
        for (k, v) in o.variants {
            *self.variants.entry(k).or_default() += v;
        }
        for e in o.errors {
            if self.errors.len() < 10 {
                self.errors.push(e);
            }
        }
        self.latencies_us.extend(o.latencies_us);
    }
}

/// Sends `rate` requests/s to app `app` at `addr` for `duration`, over `connections`
/// keep-alive connections (each paced at `rate / connections`, never more than one
/// request in flight per connection), and accounts for every request.
pub async fn drive(addr: SocketAddr, app: &str, rate: f64, duration: Duration, connections: usize) -> LoadReport {
    let total = Arc::new(Mutex::new(LoadReport::default()));
    let mut tasks = Vec::new();
    let interval = Duration::from_secs_f64(connections as f64 / rate.max(0.1));
    for c in 0..connections {
        let total = total.clone();
        let app = app.to_string();
        tasks.push(tokio::spawn(async move {
            let mut r = LoadReport::default();
            let start = Instant::now();
            // Stagger the connections over one interval.
            tokio::time::sleep(interval.mul_f64(c as f64 / connections as f64)).await;
            let mut next = Instant::now();
            let mut client: Option<sluice_loadgen::Client> = None;
            let mut i = 0u64;
            while start.elapsed() < duration {
                let now = Instant::now();
                if next > now {
                    tokio::time::sleep(next - now).await;
                }
                next += interval;
                if client.is_none() {
                    client = sluice_loadgen::Client::connect(addr).await.ok();
                }
                i += 1;
                let v = (c as u64 * 1_000_000 + i) as f32;
                let body = sluice_loadgen::infer_body("x", &[1, 4], &[v, 1.0, 2.0, 3.0]);
                r.sent += 1;
                let sent_at = Instant::now();
                let answer = match client.as_mut() {
                    Some(cl) => cl.post_json(&format!("/v2/models/{app}/infer"), &body).await.ok(),
                    None => None,
                };
                match answer {
                    Some(resp) => {
                        *r.statuses.entry(resp.status).or_default() += 1;
                        if resp.status == 200 {
                            r.latencies_us.push(sent_at.elapsed().as_micros() as u64);
                            let j = resp.json();
                            let variant = j["parameters"]["variant"].as_str().unwrap_or("?").to_string();
                            *r.variants.entry(variant).or_default() += 1;
                        } else if r.errors.len() < 5 {
                            r.errors.push(format!("{}: {}", resp.status, String::from_utf8_lossy(&resp.body)));
                        }
                    }
                    None => {
                        r.lost += 1;
                        client = None;
                    }
                }
            }
            total.lock().merge(r);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let r = total.lock().clone();
    r
}

/// The workspace root (for `target/policies` and `target/release/sluice`), from a
/// crate's manifest directory two levels down.
pub fn workspace_root(manifest_dir: &str) -> PathBuf {
    Path::new(manifest_dir).ancestors().nth(2).map(Path::to_path_buf).unwrap_or_default()
}
