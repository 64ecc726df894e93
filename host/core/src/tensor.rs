//! Tensors as they travel between the HTTP edge, the queue and the executors.
//!
//! A request carries one sample (leading dimension 1); the worker concatenates the
//! samples of a batch along dimension 0, runs the model once, and splits the
//! outputs back per request.

use thiserror::Error;

/// Element type of a tensor, named as in the Open Inference Protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// 32-bit float (`FP32`).
    F32,
    /// 64-bit float (`FP64`).
    F64,
    /// 32-bit signed integer (`INT32`).
    I32,
    /// 64-bit signed integer (`INT64`).
    I64,
    /// 8-bit unsigned integer (`UINT8`).
    U8,
}

impl DataType {
    /// The Open Inference Protocol name (`FP32`, `INT64`, ...).
    pub fn oip_name(self) -> &'static str {
        match self {
            DataType::F32 => "FP32",
            DataType::F64 => "FP64",
            DataType::I32 => "INT32",
            DataType::I64 => "INT64",
            DataType::U8 => "UINT8",
        }
    }

    /// Parses an Open Inference Protocol datatype name.
    pub fn from_oip(name: &str) -> Option<DataType> {
        Some(match name {
            "FP32" => DataType::F32,
            "FP64" => DataType::F64,
            "INT32" => DataType::I32,
            "INT64" => DataType::I64,
            "UINT8" => DataType::U8,
            _ => return None,
        })
    }
}

/// The elements of a tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// `FP32` elements.
    F32(Vec<f32>),
    /// `FP64` elements.
    F64(Vec<f64>),
    /// `INT32` elements.
    I32(Vec<i32>),
    /// `INT64` elements.
    I64(Vec<i64>),
    /// `UINT8` elements.
    U8(Vec<u8>),
}

macro_rules! each_variant {
    ($value:expr, $v:ident => $body:expr) => {
        match $value {
            TensorData::F32($v) => $body,
            TensorData::F64($v) => $body,
            TensorData::I32($v) => $body,
            TensorData::I64($v) => $body,
            TensorData::U8($v) => $body,
        }
    };
}

/// Bytes that end inside an element ([`TensorData::from_le_bytes`]): a client's
/// binary tensor data whose length does not match its datatype.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("{bytes} bytes is not a whole number of {} elements", .datatype.oip_name())]
pub struct PartialElementError {
    /// How many bytes were given.
    pub bytes: usize,
    /// The datatype they were read as.
    pub datatype: DataType,
}

impl TensorData {
    /// The element type.
    pub fn datatype(&self) -> DataType {
        match self {
            TensorData::F32(_) => DataType::F32,
            TensorData::F64(_) => DataType::F64,
            TensorData::I32(_) => DataType::I32,
            TensorData::I64(_) => DataType::I64,
            TensorData::U8(_) => DataType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each_variant!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes per element.
    pub fn width(datatype: DataType) -> usize {
        match datatype {
            DataType::F32 | DataType::I32 => 4,
            DataType::F64 | DataType::I64 => 8,
            DataType::U8 => 1,
        }
    }

    /// The elements as little-endian bytes (the binary tensor data extension's layout).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        each_variant!(self, v => v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    /// Elements from little-endian bytes; the length must be a whole number of
    /// elements of `datatype`.
    pub fn from_le_bytes(datatype: DataType, bytes: &[u8]) -> Result<TensorData, PartialElementError> {
        let width = TensorData::width(datatype);
        if !bytes.len().is_multiple_of(width) {
            return Err(PartialElementError { bytes: bytes.len(), datatype });
        }
        let chunks = bytes.chunks_exact(width);
        Ok(match datatype {
            DataType::F32 => {
                TensorData::F32(chunks.map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
            }
            DataType::F64 => {
                TensorData::F64(chunks.map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
            }
            DataType::I32 => {
                TensorData::I32(chunks.map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
            }
            DataType::I64 => {
                TensorData::I64(chunks.map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
            }
            DataType::U8 => TensorData::U8(bytes.to_vec()),
        })
    }

    /// The index of the first NaN or infinite element (floating-point types only).
    pub fn first_non_finite(&self) -> Option<usize> {
        match self {
            TensorData::F32(v) => v.iter().position(|x| !x.is_finite()),
            TensorData::F64(v) => v.iter().position(|x| !x.is_finite()),
            _ => None,
        }
    }

    fn empty_like(&self, capacity: usize) -> TensorData {
        match self {
            TensorData::F32(_) => TensorData::F32(Vec::with_capacity(capacity)),
            TensorData::F64(_) => TensorData::F64(Vec::with_capacity(capacity)),
            TensorData::I32(_) => TensorData::I32(Vec::with_capacity(capacity)),
            TensorData::I64(_) => TensorData::I64(Vec::with_capacity(capacity)),
            TensorData::U8(_) => TensorData::U8(Vec::with_capacity(capacity)),
        }
    }

    fn extend_from(&mut self, other: &TensorData) -> Result<(), TensorError> {
        match (self, other) {
            (TensorData::F32(a), TensorData::F32(b)) => a.extend_from_slice(b),
            (TensorData::F64(a), TensorData::F64(b)) => a.extend_from_slice(b),
            (TensorData::I32(a), TensorData::I32(b)) => a.extend_from_slice(b),
            (TensorData::I64(a), TensorData::I64(b)) => a.extend_from_slice(b),
            (TensorData::U8(a), TensorData::U8(b)) => a.extend_from_slice(b),
            (a, b) => {
                return Err(TensorError::Mismatch(format!(
                    "datatype {} vs {}",
                    a.datatype().oip_name(),
                    b.datatype().oip_name()
                )))
            }
        }
        Ok(())
    }

    fn slice(&self, start: usize, end: usize) -> TensorData {
        match self {
            TensorData::F32(v) => TensorData::F32(v[start..end].to_vec()),
            TensorData::F64(v) => TensorData::F64(v[start..end].to_vec()),
            TensorData::I32(v) => TensorData::I32(v[start..end].to_vec()),
            TensorData::I64(v) => TensorData::I64(v[start..end].to_vec()),
            TensorData::U8(v) => TensorData::U8(v[start..end].to_vec()),
        }
    }
}

/// A named, shaped tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Input or output name.
    pub name: String,
    /// Dimensions; the product equals `data.len()`.
    pub shape: Vec<usize>,
    /// Elements, row-major.
    pub data: TensorData,
}

/// Why tensors could not be combined or split.
#[derive(Debug, Error, PartialEq)]
pub enum TensorError {
    /// Samples of one batch disagree in datatype or shape.
    #[error("tensors in one batch differ: {0}")]
    Mismatch(String),
    /// Shape and element count disagree.
    #[error("tensor {name}: shape {shape:?} holds {expected} elements but {actual} were given")]
    ElementCount {
        /// Tensor name.
        name: String,
        /// Declared shape.
        shape: Vec<usize>,
        /// Elements the shape implies.
        expected: usize,
        /// Elements present.
        actual: usize,
    },
    /// A batch output cannot be split into the requested number of samples.
    #[error("output {name} with leading dimension {rows} cannot be split into {parts} samples")]
    Split {
        /// Tensor name.
        name: String,
        /// Leading dimension of the output.
        rows: usize,
        /// Samples wanted.
        parts: usize,
    },
}

impl Tensor {
    /// Builds a tensor, checking that the shape matches the element count.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, data: TensorData) -> Result<Tensor, TensorError> {
        let name = name.into();
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(TensorError::ElementCount { name, shape, expected, actual: data.len() });
        }
        Ok(Tensor { name, shape, data })
    }

    /// The element type.
    pub fn datatype(&self) -> DataType {
        self.data.datatype()
    }

    /// Concatenates samples along dimension 0. All must share datatype and the
    /// trailing dimensions; the result is named after the first.
    pub fn concat(samples: &[&Tensor]) -> Result<Tensor, TensorError> {
        let first = samples.first().ok_or_else(|| TensorError::Mismatch("empty batch".into()))?;
        let tail = &first.shape[1.min(first.shape.len())..];
        let mut rows = 0;
        let total: usize = samples.iter().map(|t| t.data.len()).sum();
        let mut data = first.data.empty_like(total);
        for s in samples {
            if s.shape.is_empty() || &s.shape[1..] != tail {
                return Err(TensorError::Mismatch(format!("shape {:?} vs {:?}", s.shape, first.shape)));
            }
            rows += s.shape[0];
            data.extend_from(&s.data)?;
        }
        let mut shape = first.shape.clone();
        shape[0] = rows;
        Ok(Tensor { name: first.name.clone(), shape, data })
    }

    /// Splits a batch output along dimension 0 into `parts` equal samples.
    pub fn split(&self, parts: usize) -> Result<Vec<Tensor>, TensorError> {
        let rows = self.shape.first().copied().unwrap_or(0);
        if parts == 0 || rows % parts != 0 {
            return Err(TensorError::Split { name: self.name.clone(), rows, parts });
        }
        let per = self.data.len() / parts;
        let mut shape = self.shape.clone();
        shape[0] = rows / parts;
        Ok((0..parts)
            .map(|i| Tensor {
                name: self.name.clone(),
                shape: shape.clone(),
                data: self.data.slice(i * per, (i + 1) * per),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concat_then_split_round_trips() {
        let a = Tensor::new("x", vec![1, 2], TensorData::F32(vec![1.0, 2.0])).unwrap();
        let b = Tensor::new("x", vec![1, 2], TensorData::F32(vec![3.0, 4.0])).unwrap();
        let batch = Tensor::concat(&[&a, &b]).unwrap();
        assert_eq!(batch.shape, vec![2, 2]);
        assert_eq!(batch.split(2).unwrap(), vec![a, b]);
    }

    #[test]
    fn mismatched_samples_are_refused() {
        let a = Tensor::new("x", vec![1, 2], TensorData::F32(vec![1.0, 2.0])).unwrap();
        let b = Tensor::new("x", vec![1, 1], TensorData::F32(vec![3.0])).unwrap();
        assert!(Tensor::concat(&[&a, &b]).is_err());
        assert!(Tensor::new("x", vec![2, 2], TensorData::I64(vec![1])).is_err());
        assert!(batch_split_refuses_uneven());
    }

    fn batch_split_refuses_uneven() -> bool {
        let t = Tensor::new("y", vec![3, 1], TensorData::U8(vec![1, 2, 3])).unwrap();
        t.split(2).is_err()
    }

    #[test]
    fn little_endian_bytes_round_trip() {
        for data in [
            TensorData::F32(vec![1.5, -2.0, f32::MAX]),
            TensorData::F64(vec![0.25, 1e300]),
            TensorData::I32(vec![-7, 1 << 30]),
            TensorData::I64(vec![i64::MIN, 42]),
            TensorData::U8(vec![0, 255, 7]),
        ] {
            let bytes = data.to_le_bytes();
            assert_eq!(bytes.len(), data.len() * TensorData::width(data.datatype()));
            assert_eq!(TensorData::from_le_bytes(data.datatype(), &bytes).unwrap(), data);
        }
        assert_eq!(TensorData::F32(vec![1.0]).to_le_bytes(), 1.0f32.to_le_bytes().to_vec());
        let e = TensorData::from_le_bytes(DataType::F32, &[0, 0, 0]).unwrap_err();
        assert_eq!(e, PartialElementError { bytes: 3, datatype: DataType::F32 });
        assert_eq!(e.to_string(), "3 bytes is not a whole number of FP32 elements");
        assert_eq!(TensorData::F32(vec![1.0, f32::NAN]).first_non_finite(), Some(1));
        assert_eq!(TensorData::I32(vec![1]).first_non_finite(), None);
    }
}
