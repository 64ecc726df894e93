//! The binary tensor data extension of the HTTP/REST protocol, as Triton defines it
//! and `tritonclient.http` uses it by default: a body is a JSON header of
//! `Inference-Header-Content-Length` bytes followed by the raw little-endian data of
//! every input whose `parameters` give `binary_data_size`, in input order. Outputs
//! come back the same way when the request asks for it (`binary_data: true` on a
//! requested output, or `binary_data_output: true` on the request, which tritonclient
//! sends when it names no outputs).

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::Request;
use serde_json::Value;

/// A body the extension's framing does not describe: the client's error (400 at
/// the edge, `From<BinaryError> for ApiError`).
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    /// The header is not a byte count.
    #[error("{HEADER}: expected a byte count, got {0:?}")]
    HeaderLength(hyper::header::HeaderValue),
    /// The header says the JSON is longer than the body.
    #[error("{HEADER} is {header} but the body has only {body} bytes")]
    ShortBody {
        /// The header's length, bytes.
        header: usize,
        /// The body's, bytes.
        body: usize,
    },
    /// An input's `parameters.binary_data_size` is not a byte count.
    #[error("binary_data_size: expected a byte count, got {0}")]
    DataSize(Value),
}

/// The header that marks a binary body and gives the JSON header's length.
pub const HEADER: &str = "inference-header-content-length";

/// The JSON header's length, when the request uses the extension.
pub fn header_length(req: &Request<Incoming>) -> Result<Option<usize>, BinaryError> {
    let Some(v) = req.headers().get(HEADER) else { return Ok(None) };
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map(Some)
        .ok_or_else(|| BinaryError::HeaderLength(v.clone()))
}

/// Splits a body into its JSON header and the binary data after it.
pub fn split(body: Bytes, json_len: Option<usize>) -> Result<(Bytes, Bytes), BinaryError> {
    match json_len {
        None => Ok((body, Bytes::new())),
        Some(n) if n <= body.len() => {
            let mut json = body;
            let binary = json.split_off(n);
            Ok((json, binary))
        }
        Some(n) => Err(BinaryError::ShortBody { header: n, body: body.len() }),
    }
}

/// `parameters.binary_data_size` of an input: how many of the binary bytes are its.
pub fn data_size(parameters: Option<&Value>) -> Result<Option<usize>, BinaryError> {
    match parameters.and_then(|p| p.get("binary_data_size")) {
        None => Ok(None),
        Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| BinaryError::DataSize(v.clone())),
    }
}

/// Whether `parameters` ask for `key: true`.
pub fn flag(parameters: Option<&Value>, key: &str) -> bool {
    parameters.and_then(|p| p.get(key)).and_then(Value::as_bool).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_errors_name_what_was_wrong() {
        let e = split(Bytes::from_static(b"{}"), Some(9)).unwrap_err();
        assert!(matches!(e, BinaryError::ShortBody { header: 9, body: 2 }));
        assert_eq!(e.to_string(), "inference-header-content-length is 9 but the body has only 2 bytes");
        let e = data_size(Some(&serde_json::json!({ "binary_data_size": "ten" }))).unwrap_err();
        assert_eq!(e.to_string(), "binary_data_size: expected a byte count, got \"ten\"");
        let e = BinaryError::HeaderLength(hyper::header::HeaderValue::from_static("x"));
        assert_eq!(e.to_string(), "inference-header-content-length: expected a byte count, got \"x\"");
        assert_eq!(data_size(None).unwrap(), None);
    }
}
