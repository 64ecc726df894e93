//! `sluice loadgen`: sends load to a running server with [`sluice_loadgen::run`]
//! and prints its summary (JSON with `--json`).

/// Runs `sluice loadgen`.
pub fn run(args: sluice_loadgen::LoadArgs) -> anyhow::Result<()> {
    let json = args.json;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let summary = runtime.block_on(sluice_loadgen::run(args))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        sluice_loadgen::print_summary(&summary);
    }
    Ok(())
}
