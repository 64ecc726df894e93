//! One file per subcommand: each parses its arguments (clap) and calls the library
//! that does the work.

pub mod allocate;
pub mod evaluate;
pub mod loadgen;
pub mod model_switching;
pub mod plan;
pub mod policy;
pub mod profile;
pub mod ramsis;
pub mod serve;
pub mod sim;
pub mod spread_drop;
