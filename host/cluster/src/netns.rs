//! Network namespaces for partition tests: a namespace of the test's own, joined to
//! this one by a veth pair (`ip netns`, `ip link`; Linux, needs `CAP_NET_ADMIN`). A
//! process started in it (`ip netns exec`) reaches this namespace, and is reached
//! from it, only through the pair; [`NetNs::cut`] sets this side's end down (packets
//! are dropped, as a partition does: nothing is refused, connections just stall) and
//! [`NetNs::heal`] sets it up again. Dropping the value deletes the namespace and the
//! pair with it. Nothing outside the pair's /24 is touched: no forwarding, no routes
//! beyond the two addresses' own.

use std::net::Ipv4Addr;
use std::process::Command;

/// A namespace joined to this one by a veth pair (see the module docs).
pub struct NetNs {
    /// The namespace's name (`ip netns exec NAME ...`).
    pub name: String,
    /// This namespace's end of the pair.
    host_if: String,
    /// The address of this namespace's end (what a process inside dials to reach us).
    pub host_ip: Ipv4Addr,
    /// The address of the namespace's end (what we dial to reach a process inside).
    pub ns_ip: Ipv4Addr,
}

/// Runs `ip ARGS`, naming the command in the error.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| anyhow::anyhow!("ip {}: {e}", args.join(" ")))?;
    anyhow::ensure!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

impl NetNs {
    /// Creates namespace `index` of this process (0–63), its veth pair and
    /// addresses. The subnet is `10.A.B.0/24` with A and B from the pid and `index`,
    /// so concurrent test processes do not collide.
    pub fn create(index: u8) -> anyhow::Result<NetNs> {
        anyhow::ensure!(index < 64, "namespace index {index}: at most 63");
        let pid = std::process::id();
        let name = format!("sluice-{pid}-{index}");
        // Interface names are at most 15 bytes.
        let tag = pid % 100_000;
        let host_if = format!("sl{tag}h{index}");
        let ns_if = format!("sl{tag}n{index}");
        let a = 100 + (pid / 4) % 100;
        let b = (pid % 4) * 64 + u32::from(index);
        let host_ip = Ipv4Addr::new(10, a as u8, b as u8, 1);
        let ns_ip = Ipv4Addr::new(10, a as u8, b as u8, 2);
        ip(&["netns", "add", &name])?;
        let ns = NetNs { name, host_if, host_ip, ns_ip };
        // From here on, Drop deletes the namespace (and the pair with it).
        ip(&["link", "add", &ns.host_if, "type", "veth", "peer", "name", &ns_if])?;
        ip(&["link", "set", &ns_if, "netns", &ns.name])?;
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &ns.host_if])?;
        ip(&["link", "set", &ns.host_if, "up"])?;
        ip(&["netns", "exec", &ns.name, "ip", "addr", "add", &format!("{ns_ip}/24"), "dev", &ns_if])?;
        ip(&["netns", "exec", &ns.name, "ip", "link", "set", &ns_if, "up"])?;
        ip(&["netns", "exec", &ns.name, "ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Partitions the namespace: this side's end of the pair goes down.
    pub fn cut(&self) -> anyhow::Result<()> {
        ip(&["link", "set", &self.host_if, "down"])
    }

    /// Ends the partition.
    pub fn heal(&self) -> anyhow::Result<()> {
        ip(&["link", "set", &self.host_if, "up"])
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace destroys its end of the pair, and with it ours. The
        // namespace's processes are the harness's to kill (they would keep it alive
        // otherwise; `ip netns del` only removes the name).
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}
