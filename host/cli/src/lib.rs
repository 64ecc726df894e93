//! The `sluice` command's subcommands, one file each under [`commands`]; the binary
//! (`main.rs`) parses the command line, sets up logging and calls one of them.
//!
//! The crates that do the work: `sluice_server` (serve, profile), `sluice_sim`
//! (sim, model-switching), `sluice_loadgen` (loadgen), `sluice_alloc` (allocate), `sluice_core` (profiles for
//! ramsis), and the policies' own libraries (the RAMSIS generator, the spread-drop
//! theorems).

pub mod commands;
