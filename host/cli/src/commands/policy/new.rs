//! `sluice policy new <name>`: writes a policy crate from
//! `examples/policy-template` (compiled into the binary, so the template is the one
//! source), with the SDK dependency pointing at an SDK that exists.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

/// `sluice policy new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// The crate's name (`my-policy`): letters, digits, `-` and `_`, starting with a letter.
    pub name: String,
    /// Where to create it (default: `./<name>`); must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The `sdk/` directory of a sluice checkout, for the `sluice-sdk` path
    /// dependency (Python: `sdk/python` and `wit/`). Default: the `sdk/` of the
    /// checkout this `sluice` was built from.
    #[arg(long)]
    pub sdk_path: Option<PathBuf>,
    /// The policy's language: `rust` (a crate) or `python` (a module built with
    /// componentize-py).
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
}

/// The languages `sluice policy new` writes policies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// A Rust crate on the sluice SDK, built for wasm32-unknown-unknown.
    Rust,
    /// A Python module on `sdk/python`, built with componentize-py.
    Python,
}

const CARGO_TOML: &str = include_str!("../../../../../examples/policy-template/Cargo.toml");
const LIB_RS: &str = include_str!("../../../../../examples/policy-template/src/lib.rs");
const CARGO_CONFIG: &str = include_str!("../../../../../examples/policy-template/.cargo/config.toml");
const GITIGNORE: &str = include_str!("../../../../../examples/policy-template/.gitignore");

/// The template's own lines that `new` rewrites (a test checks they are there).
const TEMPLATE_NAME: &str = "name = \"policy-template\"";
const TEMPLATE_SDK: &str = "sluice-sdk = { path = \"../../sdk\" }";
const TEMPLATE_TYPE: &str = "Template";

/// The default SDK: `sdk/` of the checkout this binary was built from.
pub fn default_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk")
}

/// Checks that `dir` holds the `sluice-sdk` crate; its absolute path.
pub fn sdk_dir(dir: &Path) -> Result<PathBuf> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).with_context(|| {
        format!("no sluice SDK at {} (no Cargo.toml there): pass --sdk-path <sluice checkout>/sdk", dir.display())
    })?;
    if !text.lines().any(|l| l.trim() == "name = \"sluice-sdk\"") {
        bail!("{} is not the sluice-sdk crate: pass --sdk-path <sluice checkout>/sdk", manifest.display());
    }
    dir.canonicalize().with_context(|| format!("resolving {}", dir.display()))
}

/// Checks a crate name; the Rust type name derived from it (`my-policy` → `MyPolicy`).
pub fn type_name(name: &str) -> Result<String> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok {
        bail!("policy name `{name}`: use letters, digits, `-` and `_`, starting with a letter");
    }
    let lib = name.replace('-', "_");
    if ["sluice_sdk", "serde", "std", "core", "alloc", "test", "proc_macro"].contains(&lib.as_str()) {
        bail!("policy name `{name}` would clash with a crate it depends on; choose another");
    }
    let camel: String = name
        .split(['-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect();
    // `Policy` is the SDK's trait; a struct of that name would shadow it.
    Ok(if camel == "Policy" { "MyPolicy".into() } else { camel })
}

/// The files of a new crate `name` depending on the SDK at `sdk` (absolute):
/// (relative path, contents).
pub fn files(name: &str, sdk: &Path) -> Result<Vec<(&'static str, String)>> {
    let ty = type_name(name)?;
    let sdk_line = format!("sluice-sdk = {{ path = {:?} }}", sdk.display().to_string());
    let body = CARGO_TOML.split_once("[package]").map_or(CARGO_TOML, |(_, rest)| rest);
    let cargo = format!(
        "# A sluice policy, made by `sluice policy new {name}`.\n\
         # Build: `sluice policy build` (or `cargo build --target wasm32-unknown-unknown --profile policy`).\n\
         # Test natively: `cargo test --release`. See docs/writing-a-policy.md in the sluice checkout.\n\
         # The SDK is a path dependency on a sluice checkout; `sluice policy new --sdk-path` picks another.\n\
         [package]{}",
        body.replace(TEMPLATE_NAME, &format!("name = {name:?}")).replace(TEMPLATE_SDK, &sdk_line)
    );
    let lib = LIB_RS.replace(TEMPLATE_TYPE, &ty).replace("\"template: {e}\"", &format!("\"{name}: {{e}}\""));
    Ok(vec![
        ("Cargo.toml", cargo),
        ("src/lib.rs", lib),
        (".cargo/config.toml", CARGO_CONFIG.to_string()),
        (".gitignore", GITIGNORE.to_string()),
    ])
}

/// Runs `sluice policy new`.
pub fn run(args: NewArgs) -> Result<()> {
    type_name(&args.name)?;
    let sdk = sdk_dir(args.sdk_path.as_deref().unwrap_or(&default_sdk()))?;
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists() && std::fs::read_dir(&dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("{} already exists and is not empty: choose another name or --dir", dir.display());
    }
    let files: Vec<(String, String)> = match args.lang {
        Lang::Rust => files(&args.name, &sdk)?.into_iter().map(|(p, t)| (p.to_string(), t)).collect(),
        Lang::Python => super::python::files(&args.name, &sdk)?,
    };
    for (path, text) in files {
        let to = dir.join(path);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&to, text).with_context(|| format!("writing {}", to.display()))?;
    }
    if args.lang == Lang::Python {
        println!("created Python policy `{}` in {} (SDK at {}/python)", args.name, dir.display(), sdk.display());
        println!("next: cd {} && pytest && sluice policy build", dir.display());
        return Ok(());
    }
    println!("created policy crate `{}` in {} (sluice-sdk at {})", args.name, dir.display(), sdk.display());
    println!("next: cd {} && cargo test --release && sluice policy build", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_has_the_lines_new_rewrites() {
        assert!(CARGO_TOML.contains(TEMPLATE_NAME));
        assert!(CARGO_TOML.contains(TEMPLATE_SDK));
        assert!(CARGO_TOML.contains("[profile.policy]"));
        assert!(LIB_RS.contains("export_policy!(Template)"));
        assert!(CARGO_CONFIG.contains("wasm-component-ld"));
    }

    #[test]
    fn files_name_the_crate_and_the_sdk() {
        let files = files("my-policy", Path::new("/opt/sluice/sdk")).unwrap();
        let cargo = &files[0].1;
        assert!(cargo.contains("name = \"my-policy\""), "{cargo}");
        assert!(cargo.contains("sluice-sdk = { path = \"/opt/sluice/sdk\" }"), "{cargo}");
        assert!(!cargo.contains("policy-template") && !cargo.contains("../../sdk"));
        let lib = &files[1].1;
        assert!(lib.contains("export_policy!(MyPolicy)") && lib.contains("impl Policy for MyPolicy"));
        assert!(!lib.contains("Template"));
    }

    #[test]
    fn names() {
        assert_eq!(type_name("my-policy").unwrap(), "MyPolicy");
        assert_eq!(type_name("fast_lane2").unwrap(), "FastLane2");
        assert!(type_name("2fast").is_err());
        assert!(type_name("a b").is_err());
        assert!(type_name("serde").is_err());
        assert!(default_sdk().join("Cargo.toml").exists());
        assert!(sdk_dir(Path::new("/nonexistent")).unwrap_err().to_string().contains("--sdk-path"));
    }
}
