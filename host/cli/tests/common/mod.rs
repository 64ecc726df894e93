//! What the tests that run the real `sluice serve` share.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

/// Writes `config` to `dir/serve.toml` and starts `sluice serve` on it (logs off).
/// Returns the process and its stdout, where it prints its addresses.
pub fn serve(config: &str, dir: &Path) -> (Child, BufReader<ChildStdout>) {
    let path = dir.join("serve.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// The address on the next line of `out`, after `prefix`.
pub fn address(out: &mut BufReader<ChildStdout>, prefix: &str) -> SocketAddr {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    line.trim().strip_prefix(prefix).unwrap_or_else(|| panic!("{line:?}")).parse().unwrap()
}
