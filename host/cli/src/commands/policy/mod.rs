//! `sluice policy`: the policy author's loop, as short as Spin's
//! (docs/writing-a-policy.md):
//!
//! - `sluice policy new <name>`: a ready crate (examples/policy-template), or with
//!   `--lang python` a Python module on `sdk/python` (python.rs);
//! - `sluice policy build`: the component, for the Wasm target and profile policies use
//!   (Python: componentize-py, installed into the project venv when missing);
//! - `sluice policy check <file.wasm>`: the world and its version (the check uploads
//!   pass), imports and exports, size, and the cost of `decide` on a standard view;
//! - `sluice policy bench <file.wasm> --against jellyfish`: standard simulated
//!   scenarios side by side, with plots;
//! - `sluice policy upload` / `swap`: the admin API of a running `sluice serve`.
//!
//! One file per step in this folder; the work is done by the libraries (the SDK's
//! template, `sluice_core::runtime`, `sluice_sim`, `sluice_loadgen`).

mod admin;
mod bench;
mod build;
mod check;
mod new;
mod python;
mod standard;

use anyhow::Result;
use clap::{Args, Subcommand};

/// `sluice policy …`
#[derive(Debug, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Write a new policy crate (from examples/policy-template), ready to build.
    New(new::NewArgs),
    /// Build the policy crate in a directory into a WebAssembly component.
    Build(build::BuildArgs),
    /// Validate a component against the policy world and measure its `decide`.
    Check(check::CheckArgs),
    /// Simulate a component and a built-in on standard scenarios, side by side.
    Bench(bench::BenchArgs),
    /// Upload a component to a running server (POST /admin/policies).
    Upload(admin::UploadArgs),
    /// Swap an app of a running server to a policy (PUT /admin/apps/{app}/policy).
    Swap(admin::SwapArgs),
}

/// Runs `sluice policy …`.
pub fn run(args: PolicyArgs) -> Result<()> {
    match args.command {
        PolicyCommand::New(a) => new::run(a),
        PolicyCommand::Build(a) => build::run(a),
        PolicyCommand::Check(a) => check::run(a),
        PolicyCommand::Bench(a) => bench::run(a),
        PolicyCommand::Upload(a) => admin::upload(a),
        PolicyCommand::Swap(a) => admin::swap(a),
    }
}
