//! The cluster demo's runner (`cargo xtask cluster-demo` builds and runs it):
//! `cluster-demo <sluice binary> <policies dir> <work dir>`. It prints its own story
//! (no log subscriber: the roles' logs are in the work dir).

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 4, "usage: cluster-demo <sluice binary> <policies dir> <work dir>");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let line = runtime.block_on(sluice_cluster::demo::run(
        std::path::Path::new(&args[1]),
        std::path::Path::new(&args[2]),
        std::path::Path::new(&args[3]),
    ))?;
    println!("{line}");
    Ok(())
}
