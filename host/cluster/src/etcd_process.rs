//! Starting a real etcd cluster of local processes on loopback: what the cluster's
//! tests, `cargo xtask cluster-demo` and the benchmarks run against. Each member
//! gets free ports on 127.0.0.1, a data directory under the caller's directory and a
//! log file beside it; dropping the cluster kills its members.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::store::{EtcdCredentials, EtcdStore, Store};

/// The etcd binary (`ETCD_BIN` overrides; Debian's `etcd-server` installs `/usr/bin/etcd`).
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("ETCD_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

/// One member.
pub struct Member {
    /// Its name (`m0`, `m1`, ...).
    pub name: String,
    /// Its client URL.
    pub client_url: String,
    /// Its client URLs on further addresses (see [`EtcdCluster::start_on`]).
    pub extra_client_urls: Vec<String>,
    peer_url: String,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A local etcd cluster (see the module docs).
pub struct EtcdCluster {
    /// The members, in start order.
    pub members: Vec<Member>,
    initial_cluster: String,
    /// Further flags for every member (see [`EtcdCluster::start_with`]).
    extra_args: Vec<String>,
}

/// How many times [`EtcdCluster::start_with`] starts a cluster whose member exited
/// before answering (see [`free_port`]).
const START_TRIES: usize = 3;

/// Why a just-spawned cluster is not ready ([`EtcdCluster::wait_started`]).
enum Started {
    /// A member's process ended: worth another try on new ports.
    Exited(anyhow::Error),
    /// A member runs and does not answer in time.
    Silent(anyhow::Error),
}

/// The last lines of a member's log (at most 2 KB), for an error.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let tail = &text[text.len().saturating_sub(2048)..];
    String::from_utf8_lossy(tail).into_owned()
}

/// A free TCP port on 127.0.0.1 (bound, read, released: another process could take
/// it in between, which a test would see as a member that does not start; a
/// cluster's start tries again then, [`EtcdCluster::start_with`]).
pub fn free_port() -> std::io::Result<u16> {
    free_port_on(std::net::Ipv4Addr::LOCALHOST.into())
}

/// A free TCP port on `ip` (as [`free_port`]).
pub fn free_port_on(ip: std::net::IpAddr) -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((ip, 0))?.local_addr()?.port())
}

impl EtcdCluster {
    /// Starts `n` members (1 or 3, usually) under `dir` and waits until the cluster
    /// answers (at most 30 s).
    pub async fn start(dir: &Path, n: usize) -> anyhow::Result<EtcdCluster> {
        Self::start_on(dir, n, &[]).await
    }

    /// As [`EtcdCluster::start`], each member also serving clients on each address of
    /// `also_on` (the partition tests' veth ends: a process in a namespace reaches
    /// etcd there, [`EtcdCluster::endpoints_on`]).
    pub async fn start_on(dir: &Path, n: usize, also_on: &[std::net::IpAddr]) -> anyhow::Result<EtcdCluster> {
        Self::start_with(dir, n, also_on, &[]).await
    }

    /// As [`EtcdCluster::start_on`], each member also given `extra_args` (e.g.
    /// `--auth-token-ttl=1`, so that a test sees etcd forget an idle token).
    pub async fn start_with(
        dir: &Path,
        n: usize,
        also_on: &[std::net::IpAddr],
        extra_args: &[&str],
    ) -> anyhow::Result<EtcdCluster> {
        anyhow::ensure!(n >= 1, "an etcd cluster needs at least one member");
        let bin = etcd_binary();
        anyhow::ensure!(bin.exists(), "etcd not found at {} (install etcd-server, or set ETCD_BIN)", bin.display());
        // A member whose port another process took between `free_port` and its own
        // bind exits at once (a full test run once waited 30 s on one): such a start
        // is tried again on new ports and fresh data directories.
        let mut tries = 1;
        loop {
            let mut cluster = Self::spawn_all(dir, n, also_on, extra_args)?;
            match cluster.wait_started(Duration::from_secs(30)).await {
                Ok(()) => return Ok(cluster),
                Err(Started::Exited(e)) if tries < START_TRIES => {
                    tracing::warn!("etcd start, try {tries} of {START_TRIES}: {e:#}; again on new ports");
                    let data_dirs: Vec<PathBuf> = cluster.members.iter().map(|m| m.data_dir.clone()).collect();
                    drop(cluster);
                    for d in data_dirs {
                        let _ = std::fs::remove_dir_all(d);
                    }
                    tries += 1;
                }
                Err(Started::Exited(e) | Started::Silent(e)) => return Err(e),
            }
        }
    }

    /// Spawns `n` new members under `dir` on free ports (see [`EtcdCluster::start_with`]).
    fn spawn_all(dir: &Path, n: usize, also_on: &[std::net::IpAddr], extra_args: &[&str]) -> anyhow::Result<Self> {
        let mut members = Vec::new();
        for i in 0..n {
            let name = format!("m{i}");
            members.push(Member {
                client_url: format!("http://127.0.0.1:{}", free_port()?),
                extra_client_urls: also_on
                    .iter()
                    .map(|ip| Ok(format!("http://{ip}:{}", free_port_on(*ip)?)))
                    .collect::<std::io::Result<_>>()?,
                peer_url: format!("http://127.0.0.1:{}", free_port()?),
                data_dir: dir.join(format!("{name}.etcd")),
                log: dir.join(format!("{name}.log")),
                name,
                child: None,
            });
        }
        let initial_cluster =
            members.iter().map(|m| format!("{}={}", m.name, m.peer_url)).collect::<Vec<_>>().join(",");
        let extra_args = extra_args.iter().map(|a| a.to_string()).collect();
        let mut cluster = EtcdCluster { members, initial_cluster, extra_args };
        for i in 0..n {
            cluster.spawn(i, "new")?;
        }
        Ok(cluster)
    }

    /// Waits until a read through every live member succeeds, telling a member
    /// whose process ended (a port taken, a bad flag: its log's last lines in the
    /// error) from one that runs and does not answer.
    async fn wait_started(&mut self, within: Duration) -> Result<(), Started> {
        let deadline = tokio::time::Instant::now() + within;
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            loop {
                let m = &mut self.members[i];
                let ok = match EtcdStore::connect(std::slice::from_ref(&m.client_url)).await {
                    Ok(s) => s.get("/sluice/health").await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    break;
                }
                if let Some(Ok(Some(status))) = m.child.as_mut().map(Child::try_wait) {
                    return Err(Started::Exited(anyhow::anyhow!(
                        "etcd member {} exited ({status}) before it answered; its log ends:\n{}",
                        m.name,
                        log_tail(&m.log)
                    )));
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(Started::Silent(anyhow::anyhow!(
                        "etcd member {} did not answer within {within:?}; its log ends:\n{}",
                        m.name,
                        log_tail(&m.log)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    fn spawn(&mut self, i: usize, state: &str) -> anyhow::Result<()> {
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log)?;
        let client_urls = std::iter::once(&m.client_url).chain(&m.extra_client_urls).cloned().collect::<Vec<_>>();
        let client_urls = client_urls.join(",");
        let child = Command::new(etcd_binary())
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &client_urls, "--advertise-client-urls", &client_urls])
            .args(["--listen-peer-urls", &m.peer_url, "--initial-advertise-peer-urls", &m.peer_url])
            .args(["--initial-cluster", &self.initial_cluster, "--initial-cluster-state", state])
            .args(["--initial-cluster-token", "sluice-test"])
            // Elections within about a second on loopback (the defaults: 100 ms, 1 s).
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", etcd_binary().display()))?;
        m.child = Some(child);
        Ok(())
    }

    /// The client URLs of every member (what roles get as `--etcd`).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// The client URLs of every member on `ip` (one of [`EtcdCluster::start_on`]'s
    /// addresses; empty for another).
    pub fn endpoints_on(&self, ip: std::net::IpAddr) -> Vec<String> {
        let host = format!("http://{ip}:");
        self.members.iter().flat_map(|m| m.extra_client_urls.iter().filter(|u| u.starts_with(&host)).cloned()).collect()
    }

    /// A store on every member.
    pub async fn store(&self) -> anyhow::Result<EtcdStore> {
        Ok(EtcdStore::connect(&self.endpoints()).await?)
    }

    /// A store on every member, authenticating as `credentials` (after
    /// [`EtcdCluster::enable_auth`]).
    pub async fn store_as(&self, credentials: &EtcdCredentials) -> anyhow::Result<EtcdStore> {
        Ok(EtcdStore::connect_as(&self.endpoints(), Some(credentials)).await?)
    }

    /// Turns etcd's authentication on, as deploy/kubernetes's `etcd-auth` Job does
    /// with etcdctl: a `root` user (etcd requires one, with the `root` role, before
    /// `auth enable`) with `root_password`, and `sluice`'s user, whose role of the
    /// same name reads and writes the keys under `prefix` and nothing else. After
    /// this, a client without credentials is refused every call.
    pub async fn enable_auth(&self, root_password: &str, sluice: &EtcdCredentials, prefix: &str) -> anyhow::Result<()> {
        let mut c = etcd_client::Client::connect(self.endpoints(), None).await?;
        c.user_add("root", root_password, None).await?;
        c.user_grant_role("root", "root").await?;
        c.role_add(sluice.user.as_str()).await?;
        c.role_grant_permission(sluice.user.as_str(), etcd_client::Permission::read_write(prefix).with_prefix())
            .await?;
        c.user_add(sluice.user.as_str(), sluice.password.as_str(), None).await?;
        c.user_grant_role(sluice.user.as_str(), sluice.user.as_str()).await?;
        c.auth_enable().await?;
        Ok(())
    }

    /// Waits until a read through every live member succeeds (at most `within`);
    /// the error names a member that exited or did not answer, with its log's end.
    pub async fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        self.wait_started(within).await.map_err(|(Started::Exited(e) | Started::Silent(e))| e)
    }

    /// The index of the member that leads now.
    pub async fn leader(&self) -> anyhow::Result<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let Ok(mut c) = etcd_client::Client::connect([m.client_url.as_str()], None).await else { continue };
            let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), c.status()).await else { continue };
            let leader = s.leader();
            for (i, other) in self.members.iter().enumerate() {
                if other.child.is_none() {
                    continue;
                }
                let Ok(mut oc) = etcd_client::Client::connect([other.client_url.as_str()], None).await else {
                    continue;
                };
                if let Ok(Ok(os)) = tokio::time::timeout(Duration::from_secs(2), oc.status()).await {
                    if os.header().map(|h| h.member_id()) == Some(leader) {
                        return Ok(i);
                    }
                }
            }
        }
        anyhow::bail!("no etcd member reports a leader")
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data directory (after [`EtcdCluster::kill`]).
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.members[i].child.is_none(), "member {i} is running");
        self.spawn(i, "existing")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
