//! `sluice profile`: measures model latency per batch size on ONNX Runtime and
//! writes a profile ([`sluice_server::profiling`]).

pub use sluice_server::profiling::ProfileArgs;

/// Runs `sluice profile`.
pub fn run(args: ProfileArgs) -> anyhow::Result<()> {
    sluice_server::profiling::run(args)
}
