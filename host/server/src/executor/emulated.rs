//! The emulated executor: waits the profiled latency of (model, batch size) and
//! returns a deterministic output, so paper-scale experiments (60–100 workers) run
//! against real HTTP traffic on a laptop.

use std::time::Duration;

use sluice_core::tensor::{Tensor, TensorData};

/// Latency of a batch of `size` on a model whose dense latency table is `table`
/// (µs, `table[b - 1]`); sizes past the table use its last entry.
pub fn batch_latency(table: &[u64], size: usize) -> Duration {
    let i = size.clamp(1, table.len().max(1)) - 1;
    Duration::from_micros(table.get(i).copied().unwrap_or(0))
}

/// The deterministic output for one sample: a `[1, 2]` FP32 tensor holding the id of
/// the model that served it and the sum of the sample's elements, so tests can check
/// which variant answered and that the request's own data went through.
pub fn output_for(model_id: u32, sample: &Tensor) -> Tensor {
    let sum = match &sample.data {
        TensorData::F32(v) => v.iter().map(|x| f64::from(*x)).sum::<f64>(),
        TensorData::F64(v) => v.iter().sum::<f64>(),
        TensorData::I32(v) => v.iter().map(|x| f64::from(*x)).sum::<f64>(),
        TensorData::I64(v) => v.iter().map(|x| *x as f64).sum::<f64>(),
        TensorData::U8(v) => v.iter().map(|x| f64::from(*x)).sum::<f64>(),
    };
    Tensor {
        name: sluice_core::executor::OUTPUT_NAME.into(),
        shape: vec![1, 2],
        data: TensorData::F32(vec![model_id as f32, sum as f32]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_lookup_clamps_to_table() {
        let t = [100, 150, 190];
        assert_eq!(batch_latency(&t, 1), Duration::from_micros(100));
        assert_eq!(batch_latency(&t, 3), Duration::from_micros(190));
        assert_eq!(batch_latency(&t, 9), Duration::from_micros(190));
        assert_eq!(batch_latency(&[], 2), Duration::ZERO);
    }

    #[test]
    fn output_names_model_and_sums_input() {
        let s = Tensor::new("x", vec![1, 3], TensorData::F32(vec![1.0, 2.0, 3.5])).unwrap();
        assert_eq!(output_for(4, &s).data, TensorData::F32(vec![4.0, 6.5]));
    }
}
