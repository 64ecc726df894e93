//! The cluster's benchmark (`cargo build --release -p sluice && cargo bench -p
//! sluice-cluster --bench cluster`; SLUICE_BIN overrides the binary). Figures go to
//! stdout; BENCHMARKS.md records them. Everything runs on this one machine, so the
//! cluster's processes share its cores with the load generator.
//!
//! 1. Remote hop overhead: 1 frontend + 2 agents (2 devices each) against the single
//!    process on the same config (4 emulated devices), closed loop, same load:
//!    throughput and p50/p99, and their ratios.
//! 2. A re-plan: from the request (`control/replan`) to routing N+1 published and to
//!    the frontend serving on it; and from a load step (demand change) to the
//!    frontend serving on a plan made for it.
//! 3. A dead agent: from SIGKILL to its key gone (lease), to routing without it, and
//!    to the frontend serving on that routing.
//! 4. Plan publication with 100 simulated agents (in-process tasks with real leases
//!    and watches on a real etcd, loading in no time): re-plan time split into solve,
//!    agents' readiness, and the whole.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_cluster::harness::{config_text, drive, workspace_root, Cluster, LoadReport};
use sluice_cluster::keys::{decode, encode, AgentRecord, DeviceInfo, FrontendRecord, Keys, Placement};
use sluice_cluster::lease::KeptLease;
use sluice_cluster::mirror::Mirror;
use sluice_cluster::store::Store;

fn bin() -> PathBuf {
    std::env::var_os("SLUICE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root(env!("CARGO_MANIFEST_DIR")).join("target/release/sluice"))
}

fn policies() -> PathBuf {
    workspace_root(env!("CARGO_MANIFEST_DIR")).join("target/policies")
}

fn line(name: &str, r: &LoadReport, secs: f64) {
    println!(
        "  {name:<36} {:>7.0} req/s served   p50 {:>6.2} ms   p99 {:>6.2} ms   ({} sent, {} ok, {} lost)",
        r.count(200) as f64 / secs,
        r.quantile_us(0.5) as f64 / 1e3,
        r.quantile_us(0.99) as f64 / 1e3,
        r.sent,
        r.count(200),
        r.lost
    );
}

async fn frontend_epoch(c: &Cluster, id: &str) -> u64 {
    match c.store.get(&c.keys.frontend(id)).await {
        Ok(Some(kv)) => decode::<FrontendRecord>(&kv.key, &kv.value).map_or(0, |r| r.routing_epoch),
        _ => 0,
    }
}

async fn poll<F: std::future::Future<Output = bool>>(within: Duration, mut f: impl FnMut() -> F) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if f().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("timed out".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
}

/// The single process on `config`, driven at each rate of `rates` in turn.
async fn single_process(
    dir: &std::path::Path,
    config: &str,
    rates: &[f64],
    secs: u64,
    conns: usize,
) -> anyhow::Result<Vec<LoadReport>> {
    std::fs::write(dir.join("single.toml"), config)?;
    let mut child = std::process::Command::new(bin())
        .args(["serve", "--config"])
        .arg(dir.join("single.toml"))
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut l = String::new();
    std::io::BufRead::read_line(&mut out, &mut l)?;
    let addr: SocketAddr = l.trim().trim_start_matches("sluice listening on http://").parse()?;
    let mut reports = Vec::new();
    for &rate in rates {
        reports.push(drive(addr, "img", rate, Duration::from_secs(secs), conns).await);
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(reports)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    // Emulated variants at a tenth of the test profile (small: 0.1 ms at batch 1), so
    // the hop, not the model, dominates.
    let config = config_text(dir, &policies(), 4, 200, 1.0).replace("emulated.toml", "fast.toml");
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("fast.toml"), sluice_cluster::harness::emulated_profile(0.1))?;
    let (rate, secs, conns) = (4000.0, 8, 16);
    // Offered far past what either serves: each connection sends its next request as
    // soon as the last is answered (closed loop), so what is served is the capacity.
    let saturating = 1e6;

    println!(
        "1. remote hop overhead ({conns} connections, {secs} s each: {rate} req/s offered, then closed loop at capacity)"
    );
    let single = single_process(dir, &config, &[rate, saturating], secs, conns).await?;
    line("single process", &single[0], secs as f64);
    line("single process, closed loop", &single[1], secs as f64);
    let mut c = Cluster::start(&bin(), dir, 3, &config).await?;
    std::fs::write(dir.join("fast.toml"), sluice_cluster::harness::emulated_profile(0.1))?;
    c.allocator("alloc1")?;
    c.agent("a1", 2)?;
    c.agent("a2", 2)?;
    let fe = c.frontend("f1", 2000)?;
    c.wait_ready(fe, Duration::from_secs(60)).await?;
    let cluster = drive(fe, "img", rate, Duration::from_secs(secs), conns).await;
    line("1 frontend + 2 agents", &cluster, secs as f64);
    let cluster_max = drive(fe, "img", saturating, Duration::from_secs(secs), conns).await;
    line("1 frontend + 2 agents, closed loop", &cluster_max, secs as f64);
    for (what, c, s) in [("offered load", &cluster, &single[0]), ("closed loop", &cluster_max, &single[1])] {
        println!(
            "  cluster/single, {what}: throughput {:.2}×, p50 {:.2}×, p99 {:.2}×",
            c.count(200) as f64 / s.count(200).max(1) as f64,
            c.quantile_us(0.5) as f64 / s.quantile_us(0.5).max(1) as f64,
            c.quantile_us(0.99) as f64 / s.quantile_us(0.99).max(1) as f64
        );
    }

    println!("2. re-plan latency");
    let before = c.routing().await.map_or(0, |t| t.epoch);
    let asked = Instant::now();
    c.ask_replan().await?;
    let published =
        poll(Duration::from_secs(30), || async { c.routing().await.is_some_and(|t| t.epoch > before) }).await;
    let serving = poll(Duration::from_secs(30), || async { frontend_epoch(&c, "f1").await > before })
        .await
        .map(|_| asked.elapsed());
    println!("  asked → routing published: {}   asked → frontend serving on it: {}", ms(published), ms(serving));
    let before = c.routing().await.map_or(0, |t| t.epoch);
    let load = tokio::spawn(drive(fe, "img", 300.0, Duration::from_secs(12), 4));
    let stepped = poll(Duration::from_secs(12), || async { frontend_epoch(&c, "f1").await > before }).await;
    println!(
        "  load step 0 → 300 req/s → frontend serving on a plan for it: {} (1 s demand reports, period_s = 2)",
        ms(stepped)
    );
    let _ = load.await;

    println!("3. a dead agent (lease TTL 2 s)");
    let routing = c.routing().await.ok_or_else(|| anyhow::anyhow!("no routing"))?;
    let victim = routing.apps["img"][0].agent.clone();
    let before = routing.epoch;
    let killed = Instant::now();
    c.signal(&victim, "KILL")?;
    let gone = poll(Duration::from_secs(20), || async { c.agents().await.iter().all(|a| a.id != victim) }).await;
    let rerouted = poll(Duration::from_secs(30), || async {
        c.routing().await.is_some_and(|t| t.epoch > before && t.apps.values().flatten().all(|r| r.agent != victim))
    })
    .await
    .map(|_| killed.elapsed());
    let served = poll(Duration::from_secs(30), || async { frontend_epoch(&c, "f1").await > before })
        .await
        .map(|_| killed.elapsed());
    println!(
        "  kill → lease gone: {}   kill → routing without it: {}   kill → frontend on it: {}",
        ms(gone),
        ms(rerouted),
        ms(served)
    );
    drop(c);

    println!("4. plan publication with simulated agents (1 device each, real etcd, in-process allocator)");
    for n in [10usize, 100] {
        let sub = dir.join(format!("sim{n}"));
        std::fs::create_dir_all(&sub)?;
        std::fs::write(sub.join("emulated.toml"), sluice_cluster::harness::emulated_profile(1.0))?;
        let text = config_text(&sub, &policies(), n as u32, 200, 10.0 * n as f64);
        let config = sluice_server::config::Config::parse(&text, "bench config", &sub)?;
        let etcd = sluice_cluster::etcd_process::EtcdCluster::start(&sub, 1).await?;
        let store: Arc<dyn Store> = Arc::new(etcd.store().await?);
        let keys = Keys::default();
        let mut agents = Vec::new();
        for i in 0..n {
            agents.push(tokio::spawn(simulated_agent(store.clone(), keys.clone(), format!("sim{i:03}"))));
        }
        let stats = Arc::new(sluice_cluster::allocator::AllocatorStats::default());
        let options = sluice_cluster::allocator::AllocatorOptions {
            id: "alloc".into(),
            ttl_s: 5,
            keys: keys.clone(),
            ready_timeout: Duration::from_secs(60),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let alloc =
            tokio::spawn(sluice_cluster::allocator::run(store.clone(), config, options, stats.clone(), async move {
                let _ = stopped.await;
            }));
        // The first plan (all agents registered), then one asked for.
        let all = poll(Duration::from_secs(60), || async {
            let t = store.get(&keys.routing()).await.ok().flatten();
            t.and_then(|kv| decode::<sluice_cluster::keys::RoutingTable>(&kv.key, &kv.value).ok())
                .is_some_and(|t| t.apps.values().map(Vec::len).sum::<usize>() > 0)
                && store.list(&keys.agents()).await.map_or(0, |l| l.kvs.len()) == n
        })
        .await;
        // Membership may still settle (agents registering after the first plan).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = stats.epoch.load(Ordering::Relaxed);
        store.put(&keys.replan(), b"bench".to_vec(), None).await?;
        let done = poll(Duration::from_secs(60), || async { stats.epoch.load(Ordering::Relaxed) > before }).await;
        println!(
            "  {n:>3} agents: first plan {}; asked → routing published {} (solve {:.0} ms, agents ready {:.0} ms, whole {:.0} ms)",
            ms(all),
            ms(done),
            stats.last_solve_us.load(Ordering::Relaxed) as f64 / 1e3,
            stats.last_ready_us.load(Ordering::Relaxed) as f64 / 1e3,
            stats.last_total_us.load(Ordering::Relaxed) as f64 / 1e3,
        );
        let _ = stop.send(());
        let _ = alloc.await;
        for a in agents {
            a.abort();
        }
    }
    Ok(())
}

/// An agent with one cpu device that loads in no time: registers under a lease,
/// and reports every placement epoch ready as soon as it sees it.
async fn simulated_agent(store: Arc<dyn Store>, keys: Keys, id: String) {
    let Ok(lease) = KeptLease::grant(store.clone(), 5).await else { return };
    let placement = Mirror::start(store.clone(), keys.placement());
    let mut rx = placement.subscribe();
    let mut record = AgentRecord {
        id: id.clone(),
        addr: "http://127.0.0.1:9".into(),
        devices: vec![DeviceInfo { index: 0, kind: "cpu".into() }],
        loaded: vec![],
        ready_epoch: 0,
        accepting: true,
    };
    let _ = store.put(&keys.agent(&id), encode(&record), Some(lease.id)).await;
    loop {
        if rx.changed().await.is_err() {
            return;
        }
        let snap = rx.borrow_and_update().clone();
        let Some(kv) = snap.kvs.get(&keys.placement()) else { continue };
        let Ok(p) = decode::<Placement>(&kv.key, &kv.value) else { continue };
        if p.epoch > record.ready_epoch {
            record.ready_epoch = p.epoch;
            let _ = store.put(&keys.agent(&id), encode(&record), Some(lease.id)).await;
        }
    }
}
