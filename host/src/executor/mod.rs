//! Model executors: what actually runs a batch.
//!
//! - [`onnx`]: real models through ONNX Runtime (the `ort` crate, CPU or CUDA).
//! - [`emulated`]: waits the profiled latency and returns a deterministic output.
//! - [`models`]: the models loaded on one worker and how a batch runs on them.

pub mod emulated;
pub mod models;
pub mod onnx;
