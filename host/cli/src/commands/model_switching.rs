//! `sluice model-switching build|convert`: `build` calls
//! [`sluice_sim::model_switching::build`], writes the table and compares it with a
//! reference; `convert` turns the RAMSIS artifact's table directory into the
//! policy's params.

use anyhow::{Context, Result};
use serde_json::json;
use sluice_sim::model_switching::{
    build, convert_reference, model_order, models_by_latency, read_reference, BuildArgs,
};

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
    /// Convert a reference table directory (`test_rate-<r>_pi.json` files, 1-based
    /// indices into the models in increasing batch-1 latency) into the policy's params.
    Convert(ConvertArgs),
}

/// `sluice model-switching convert` arguments.
#[derive(clap::Args, Debug)]
struct ConvertArgs {
    /// The reference's table directory.
    #[arg(long)]
    reference: std::path::PathBuf,
    /// Profile of the models.
    #[arg(long)]
    profile: std::path::PathBuf,
    /// The models the indices count (default: all in the profile), in any order:
    /// they are sorted by batch-1 latency as the artifact numbers them.
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Largest batch of the profile's tables.
    #[arg(long, default_value_t = 32)]
    max_batch: u32,
    /// Write the params here (default: print them).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

fn write_table(table: &[(f64, String)], out: Option<&std::path::Path>) -> Result<()> {
    let params = json!({ "table": table.iter().map(|(l, m)| json!([l, m])).collect::<Vec<_>>() });
    let text = serde_json::to_string_pretty(&params)? + "\n";
    match out {
        Some(out) => std::fs::write(out, text).with_context(|| format!("write {}", out.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Runs `sluice model-switching`.
pub fn run(args: ModelSwitchingArgs) -> Result<()> {
    match args.command {
        Command::Convert(c) => {
            // The same model order as `build` uses for its comparison.
            let names = models_by_latency(&c.profile, &c.models, c.max_batch)?;
            let table = convert_reference(&c.reference, &names)?;
            write_table(&table, c.out.as_deref())
        }
        Command::Build(b) => {
            let table = build(&b)?;
            if let Some(out) = &b.out {
                write_table(&table, Some(out))?;
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
