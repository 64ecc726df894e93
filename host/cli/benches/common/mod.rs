//! What the benches that run the real `sluice serve` share: starting it as a
//! separate process, finding its address, reading its RSS and CPU time, killing it
//! when done.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use anyhow::{bail, Context, Result};

/// A running `sluice serve` process; killed when dropped.
pub struct ServerProcess {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Kept open while it runs (it writes there); [`ServerProcess::grpc_addr`]
    /// reads its later lines.
    stdout: BufReader<ChildStdout>,
}

impl ServerProcess {
    /// Its resident memory, MiB (NaN when it cannot be read).
    #[allow(dead_code)] // Not every bench reads it.
    pub fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    }

    /// User + system CPU seconds it has used so far, from `/proc/<pid>/stat`
    /// (`ticks_per_second`: [`clock_ticks`]).
    #[allow(dead_code)] // Not every bench reads it.
    pub fn cpu_seconds(&self, ticks_per_second: f64) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i - 3).and_then(|x| x.parse::<f64>().ok()).unwrap_or(f64::NAN);
        (ticks(14) + ticks(15)) / ticks_per_second
    }

    /// Its process id (for a profiler to attach to).
    #[allow(dead_code)] // Not every bench reads it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The gRPC address it prints after its HTTP one (`... gRPC listening on ADDR`),
    /// for a server started with a gRPC listener (`--grpc-listen 127.0.0.1:0`); call
    /// it once, right after starting.
    #[allow(dead_code)] // Not every bench serves gRPC.
    pub fn grpc_addr(&mut self) -> Result<SocketAddr> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                bail!("the server printed no gRPC address");
            }
            if let Some((_, addr)) = line.trim().split_once("gRPC listening on ") {
                return addr.parse().with_context(|| format!("address in {line:?}"));
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `sluice serve --config <config> --listen 127.0.0.1:0` (the binary cargo
/// builds for every bench target) and reads the address it prints.
#[allow(dead_code)] // The memory bench runs the embedded default instead.
pub fn start_server(config: &Path) -> Result<ServerProcess> {
    let dir = std::env::current_dir()?;
    start_server_with(&dir, &[std::ffi::OsStr::new("--config"), config.as_os_str()])
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 when it cannot be read).
#[allow(dead_code)] // Not every bench reads it.
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Starts `sluice serve <args> --listen 127.0.0.1:0` in `dir` and reads the address
/// it prints; no `--config` in `args` serves the embedded default. `SLUICE_BENCH_EXE`
/// names another build of `sluice` to run (an A/B of two builds with the same bench).
#[allow(dead_code)] // The overhead bench builds its own command.
pub fn start_server_with(dir: &Path, args: &[&std::ffi::OsStr]) -> Result<ServerProcess> {
    let exe = std::env::var_os("SLUICE_BENCH_EXE").unwrap_or_else(|| env!("CARGO_BIN_EXE_sluice").into());
    let mut command = Command::new(exe);
    command.current_dir(dir).arg("serve").args(args).args(["--listen", "127.0.0.1:0"]).env("RUST_LOG", "warn");
    start_process(command)
}

/// Starts `command`, a server that prints `... listening on http://ADDR` as its
/// first line on stdout (as `sluice serve` does), and reads that address.
pub fn start_process(mut command: Command) -> Result<ServerProcess> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawn {:?}", command.get_program()))?;
    let mut stdout = BufReader::new(child.stdout.take().context("server stdout")?);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    let Some((_, addr)) = line.trim().split_once(" listening on http://") else {
        let _ = child.kill();
        bail!("server did not start (first stdout line: {line:?})");
    };
    let addr = addr.parse().with_context(|| format!("address in {line:?}"))?;
    Ok(ServerProcess { child, addr, stdout })
}
