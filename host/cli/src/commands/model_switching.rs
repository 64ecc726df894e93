//! `sluice model-switching build`: parses and calls
//! [`sluice_sim::model_switching::build`], writes the table and compares it with a
//! reference.

use anyhow::{Context, Result};
use serde_json::json;
use sluice_sim::model_switching::{build, model_order, read_reference, BuildArgs};

/// `sluice model-switching` subcommands.
#[derive(clap::Args, Debug)]
pub struct ModelSwitchingArgs {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Build a load → model table by simulation.
    Build(BuildArgs),
}

/// Runs `sluice model-switching`.
pub fn run(args: ModelSwitchingArgs) -> Result<()> {
    match args.command {
        Command::Build(b) => {
            let table = build(&b)?;
            let params = json!({ "table": table.iter().map(|(l, m)| json!([l, m])).collect::<Vec<_>>() });
            if let Some(out) = &b.out {
                std::fs::write(out, serde_json::to_string_pretty(&params)? + "\n")
                    .with_context(|| format!("write {}", out.display()))?;
            }
            let reference = match &b.compare {
                Some(dir) => Some(read_reference(dir)?),
                None => None,
            };
            let names = model_order(&b)?;
            let mut agree = 0;
            println!("{:>8}  {:<22} {}", "load", "model", if reference.is_some() { "reference" } else { "" });
            for (load, model) in &table {
                let r = reference.as_ref().and_then(|r| r.get(&(*load as u64))).map(|i| names[*i - 1].clone());
                if r.as_deref() == Some(model.as_str()) {
                    agree += 1;
                }
                println!("{load:>8.0}  {model:<22} {}", r.unwrap_or_default());
            }
            if reference.is_some() {
                println!("agreement with the reference: {agree} of {} loads", table.len());
            }
            Ok(())
        }
    }
}
