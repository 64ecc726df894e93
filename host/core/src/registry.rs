//! Known policies by name: the built-ins (`target/policies/<name>.wasm`, built by
//! `cargo xtask policies`) and the uploaded ones, kept in the policy directory.
//!
//! The policy directory is opened once with cap-std, so every later file operation is
//! confined to it: a name can never address a file outside it, whatever it contains
//! (names are validated too, as a second line of defence and for clear errors).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use parking_lot::RwLock;
use serde::Serialize;
use thiserror::Error;

use crate::app_config::valid_name;
use crate::runtime::{CompiledPolicy, PolicyEngine, PolicyError};

/// Names no component may take. `safe` is the native safe policy (the fallback
/// every app answers with after a fault, and what the simulator and what-if
/// evaluations run for `policy = "safe"` without asking the registry): a component
/// stored under it would mean one thing live and another in a replay. Test
/// fixtures (`misbehave`) are not reserved: they are never built-ins
/// (`target/fixtures/`), and uploading one is an ordinary upload.
pub const RESERVED: &[&str] = &[crate::decision::SAFE_POLICY];

/// Largest accepted component: far above any real policy (the built-ins are ~20-100 KB),
/// small enough that an upload cannot exhaust memory.
pub const MAX_POLICY_BYTES: usize = 32 << 20;

/// Why a policy could not be found or stored.
#[derive(Debug, Error)]
pub enum RegistryError {
    /// No built-in or uploaded policy has this name.
    #[error("unknown policy `{0}` (see GET /admin/policies)")]
    Unknown(String),
    /// The name is not acceptable.
    #[error(
        "invalid policy name `{0}`: expected 1-64 characters of a-z, A-Z, 0-9, '-', '_', '.', not starting with '.'"
    )]
    BadName(String),
    /// The name is reserved ([`RESERVED`]).
    #[error(
        "policy name `{0}` is reserved: it names the native safe policy (the fallback), which is not a component; \
         upload under another name"
    )]
    Reserved(String),
    /// Uploads may not replace a built-in.
    #[error("policy `{0}` is a built-in and cannot be replaced; upload it under another name")]
    Builtin(String),
    /// Too large.
    #[error("policy component is {0} bytes; the limit is {MAX_POLICY_BYTES}")]
    TooLarge(usize),
    /// Compilation or validation failed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The policy directory could not be used.
    #[error("policy directory {dir}: {source}")]
    Io {
        /// The directory.
        dir: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Where a policy came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Built with the host (`target/policies`).
    Builtin,
    /// Uploaded through the admin API.
    Uploaded,
}

/// A registry entry as listed by `GET /admin/policies`.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyInfo {
    /// Name.
    pub name: String,
    /// Where it came from.
    pub source: Source,
    /// Digest, once compiled.
    pub digest: Option<String>,
    /// Size in bytes, once read.
    pub size: Option<usize>,
}

struct Entry {
    source: Source,
    path: Option<PathBuf>,
    compiled: Option<Arc<CompiledPolicy>>,
}

/// The policy registry.
pub struct Registry {
    engine: Arc<PolicyEngine>,
    uploads: Dir,
    upload_path: PathBuf,
    entries: RwLock<BTreeMap<String, Entry>>,
}

impl Registry {
    /// Opens the registry: lists the built-ins, creates the policy directory if needed
    /// and compiles every policy uploaded before (ones that no longer compile are
    /// logged and skipped).
    pub fn open(engine: Arc<PolicyEngine>, builtin_dir: &Path, policy_dir: &Path) -> Result<Registry, RegistryError> {
        let io = |source| RegistryError::Io { dir: policy_dir.display().to_string(), source };
        std::fs::create_dir_all(policy_dir).map_err(io)?;
        let uploads = Dir::open_ambient_dir(policy_dir, ambient_authority()).map_err(io)?;
        let mut entries = BTreeMap::new();
        if let Ok(read) = std::fs::read_dir(builtin_dir) {
            for e in read.flatten() {
                let path = e.path();
                if let Some(name) = wasm_stem(&path) {
                    entries.insert(name, Entry { source: Source::Builtin, path: Some(path), compiled: None });
                }
            }
        } else {
            tracing::warn!("built-in policy directory {} not found: run `cargo xtask policies`", builtin_dir.display());
        }
        let registry =
            Registry { engine, uploads, upload_path: policy_dir.to_path_buf(), entries: RwLock::new(entries) };
        let names: Vec<String> = registry
            .uploads
            .entries()
            .map_err(io)?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|f| f.strip_suffix(".wasm").map(str::to_string))
            .filter(|n| valid_name(n))
            .collect();
        for name in names {
            if RESERVED.contains(&name.as_str()) {
                tracing::error!(
                    "skipping stored policy {name}.wasm: the name `{name}` is reserved for the native safe policy"
                );
                continue;
            }
            if registry.entries.read().get(&name).is_some_and(|e| e.source == Source::Builtin) {
                continue;
            }
            let loaded = registry
                .uploads
                .read(format!("{name}.wasm"))
                .map_err(|e| e.to_string())
                .and_then(|bytes| registry.engine.compile(&name, &bytes).map_err(|e| e.to_string()));
            match loaded {
                Ok(c) => {
                    registry
                        .entries
                        .write()
                        .insert(name, Entry { source: Source::Uploaded, path: None, compiled: Some(c) });
                }
                Err(e) => tracing::error!("skipping stored policy {name}: {e}"),
            }
        }
        Ok(registry)
    }

    /// The engine the registry compiles with (instances of its policies come from it).
    pub fn engine(&self) -> &Arc<PolicyEngine> {
        &self.engine
    }

    /// The compiled policy `name`, compiling a built-in on first use.
    pub fn get(&self, name: &str) -> Result<Arc<CompiledPolicy>, RegistryError> {
        if RESERVED.contains(&name) {
            return Err(RegistryError::Reserved(name.to_string()));
        }
        if let Some(c) = self.entries.read().get(name).and_then(|e| e.compiled.clone()) {
            return Ok(c);
        }
        let path = match self.entries.read().get(name) {
            Some(Entry { path: Some(p), .. }) => p.clone(),
            _ => return Err(RegistryError::Unknown(name.to_string())),
        };
        let bytes =
            std::fs::read(&path).map_err(|source| RegistryError::Io { dir: path.display().to_string(), source })?;
        let compiled = self.engine.compile(name, &bytes)?;
        if let Some(e) = self.entries.write().get_mut(name) {
            e.compiled = Some(compiled.clone());
        }
        Ok(compiled)
    }

    /// Validates, compiles and stores an uploaded component under `name`. Nothing is
    /// stored unless it compiles against the world.
    pub fn upload(&self, name: &str, bytes: &[u8]) -> Result<Arc<CompiledPolicy>, RegistryError> {
        self.check_upload_name(name)?;
        if bytes.len() > MAX_POLICY_BYTES {
            return Err(RegistryError::TooLarge(bytes.len()));
        }
        let compiled = self.engine.compile(name, bytes)?;
        let io = |source| RegistryError::Io { dir: self.upload_path.display().to_string(), source };
        // Write then rename, so a crash never leaves a truncated component behind.
        let tmp = format!(".{name}.wasm.tmp");
        self.uploads.write(&tmp, bytes).map_err(io)?;
        self.uploads.rename(&tmp, &self.uploads, format!("{name}.wasm")).map_err(io)?;
        self.entries
            .write()
            .insert(name.to_string(), Entry { source: Source::Uploaded, path: None, compiled: Some(compiled.clone()) });
        Ok(compiled)
    }

    /// Whether a component may be uploaded as `name`: a valid name, not reserved
    /// ([`RESERVED`]), not a built-in's. The admin API asks before reading the
    /// body, so a refused upload costs no transfer.
    pub fn check_upload_name(&self, name: &str) -> Result<(), RegistryError> {
        if !valid_name(name) {
            return Err(RegistryError::BadName(name.to_string()));
        }
        if RESERVED.contains(&name) {
            return Err(RegistryError::Reserved(name.to_string()));
        }
        if self.entries.read().get(name).is_some_and(|e| e.source == Source::Builtin) {
            return Err(RegistryError::Builtin(name.to_string()));
        }
        Ok(())
    }

    /// Every known policy.
    pub fn list(&self) -> Vec<PolicyInfo> {
        self.entries
            .read()
            .iter()
            .map(|(name, e)| PolicyInfo {
                name: name.clone(),
                source: e.source,
                digest: e.compiled.as_ref().map(|c| c.digest.clone()),
                size: e.compiled.as_ref().map(|c| c.size),
            })
            .collect()
    }
}

fn wasm_stem(path: &Path) -> Option<String> {
    if path.extension()? != "wasm" {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    valid_name(stem).then(|| stem.to_string())
}
