//! The one error type of the files sluice reads — server configs, allocation
//! problems —: every message names the file, and the field where there is one.

use thiserror::Error;

/// A file could not be used.
#[derive(Debug, Error)]
pub enum FileError {
    /// The file (or a file it names) could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, a missing field, a wrong type or an unknown field.
    #[error("{file}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// toml's message, which names the line and the field.
        message: String,
    },
    /// A value that parses but cannot be used.
    #[error("{file}: {field}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// Dotted path of the offending field (`app.imagenet.workers`).
        field: String,
        /// What was expected.
        message: String,
    },
}

impl FileError {
    /// A [`FileError::Parse`] from toml's error.
    pub fn parse(file: &str, e: toml::de::Error) -> FileError {
        FileError::Parse { file: file.to_string(), message: e.to_string() }
    }

    /// A [`FileError::Invalid`].
    pub fn invalid(file: &str, field: impl Into<String>, message: impl Into<String>) -> FileError {
        FileError::Invalid { file: file.to_string(), field: field.into(), message: message.into() }
    }
}
