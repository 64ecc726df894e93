//! WASI 0.2 for policy components that import it, with nothing granted.
//!
//! `componentize-py` (Python policies) builds components that import the WASI 0.2
//! interfaces CPython's runtime is linked against, whether or not the policy does
//! any I/O. Those components get the interfaces from `wasmtime-wasi`, configured so
//! that they give the guest nothing the contract (`wit/policy.wit`) does not:
//!
//! 1. no preopened directories, so `wasi:filesystem` reaches no file;
//! 2. no network: every socket address is refused and name lookup is off;
//! 3. no environment variables, no arguments, an empty stdin;
//! 4. clocks frozen at zero: a policy reads the time from `view.now`, never from a
//!    clock of its own, so a replay in virtual time decides as the live host did;
//! 5. randomness from a generator with a fixed seed: the contract has a policy seed
//!    its randomness through `params`, and CPython's start-up draws (hash seed,
//!    `random`'s seed) must not make two runs of the same trace differ;
//! 6. stdout and stderr into a small buffer per instance that the runtime drains
//!    into the policy log (rate-limited like `log`) after each call, and reads a
//!    Python exception's traceback from when a call traps.
//!
//! Components without WASI imports (every Rust policy built for
//! `wasm32-unknown-unknown`) never touch this module: they are linked without it and
//! their stores carry no WASI state.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::clocks::{HostMonotonicClock, HostWallClock};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{Deterministic, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::HostState;

/// The WASI 0.2 interfaces [`add_to_linker`] provides (what
/// `wasmtime_wasi::p2::add_to_linker_sync` links), without their version. A
/// component importing any other `wasi:` interface (`wasi:http`, `wasi:keyvalue`,
/// WASI 0.3) is refused by name before it is compiled.
pub const PROVIDED: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:filesystem/preopens",
    "wasi:filesystem/types",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:sockets/instance-network",
    "wasi:sockets/ip-name-lookup",
    "wasi:sockets/network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
];

/// Whether `import` (a component's top-level import name) is a WASI interface
/// this host links: one of [`PROVIDED`] at a 0.2 version.
pub fn provides(import: &str) -> bool {
    let Some((interface, version)) = import.split_once('@') else { return false };
    PROVIDED.contains(&interface) && version.starts_with("0.2.")
}

/// Adds the WASI 0.2 interfaces to `linker` (synchronous: policy calls are plain
/// calls on the worker's thread).
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)
}

/// Most bytes of stdout or stderr kept between two drains; the rest of a call's
/// output is discarded (a policy printing in a loop must not grow the host's
/// memory). A traceback is a few KiB.
const OUTPUT_CAP: usize = 16 << 10;

/// Where every instance's randomness comes from (item 5 of the module docs): the
/// bytes of this text's SHA-256, repeated. Fixed, so that the same component decides
/// the same on the same trace; not for secrets (the contract has none).
const RANDOM_SEED: &[u8] = b"sluice:policy randomness";

fn seeded() -> Deterministic {
    use sha2::Digest;
    Deterministic::new(sha2::Sha256::digest(RANDOM_SEED).to_vec())
}

/// One instance's WASI state: the context (what is granted: nothing), its resource
/// table, and its captured stdout and stderr.
pub struct WasiState {
    ctx: WasiCtx,
    table: ResourceTable,
    /// What the guest wrote to stdout since the last drain.
    pub stdout: Output,
    /// What the guest wrote to stderr since the last drain.
    pub stderr: Output,
}

impl Default for WasiState {
    /// A context granting nothing (module docs, items 1–6).
    fn default() -> WasiState {
        let (stdout, stderr) = (Output::default(), Output::default());
        let ctx = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(Frozen)
            .monotonic_clock(Frozen)
            .secure_random(seeded())
            .insecure_random(seeded())
            .insecure_random_seed(0x5eed)
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .build();
        WasiState { ctx, table: ResourceTable::new(), stdout, stderr }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        // Only components that import WASI are linked with the WASI interfaces, and
        // exactly their stores are made with a `WasiState` (`CompiledPolicy::wasi`),
        // so a WASI host function never runs in a store without one.
        let wasi = self.wasi.as_deref_mut().expect("a WASI import called in a store made without WASI state");
        WasiCtxView { ctx: &mut wasi.ctx, table: &mut wasi.table }
    }
}

/// Clocks that always read zero (module docs, item 4).
struct Frozen;

impl HostWallClock for Frozen {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl HostMonotonicClock for Frozen {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// A capped buffer a guest's stdout or stderr writes into; shared between the
/// stream handed to the guest and the runtime that drains it.
#[derive(Clone, Default)]
pub struct Output(Arc<Mutex<Vec<u8>>>);

impl Output {
    /// Takes what was written since the last call (lossy UTF-8), or `None` when
    /// nothing was.
    pub fn take(&self) -> Option<String> {
        let mut buf = self.0.lock();
        if buf.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&buf).into_owned();
        buf.clear();
        Some(text)
    }
}

impl IsTerminal for Output {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Output {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Output {
    // Always writable: writes go to memory and never block.
    async fn ready(&mut self) {}
}

impl OutputStream for Output {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let mut buf = self.0.lock();
        let room = OUTPUT_CAP.saturating_sub(buf.len());
        // Accepted in full even when cut: an error here would raise in the guest's
        // `print`, turning a chatty policy into a faulting one.
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(OUTPUT_CAP)
    }
}

impl tokio::io::AsyncWrite for Output {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut out = self.0.lock();
        let room = OUTPUT_CAP.saturating_sub(out.len());
        out.extend_from_slice(&buf[..buf.len().min(room)]);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_provided_interfaces_at_0_2_are_provided() {
        assert!(provides("wasi:io/streams@0.2.0"));
        assert!(provides("wasi:cli/stderr@0.2.6"));
        assert!(!provides("wasi:http/outgoing-handler@0.2.0"));
        assert!(!provides("wasi:io/streams@0.3.0"));
        assert!(!provides("wasi:io/streams"));
        assert!(!provides("log"));
    }

    #[test]
    fn output_is_capped_and_drained() {
        let mut out = Output::default();
        assert_eq!(out.take(), None);
        out.write(Bytes::from_static(b"hello\n")).unwrap();
        assert_eq!(out.take().as_deref(), Some("hello\n"));
        out.write(Bytes::from(vec![b'x'; OUTPUT_CAP * 2])).unwrap();
        assert_eq!(out.take().map(|s| s.len()), Some(OUTPUT_CAP));
    }
}
