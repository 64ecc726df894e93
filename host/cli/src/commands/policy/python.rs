//! Python policies: the directory `sluice policy new --lang python` writes, and
//! the build `sluice policy build` runs for it.
//!
//! A Python policy directory holds a `pyproject.toml` whose `[tool.sluice]` table
//! names the module to build (`module = "my_policy"`) and, optionally, the sluice
//! SDK it uses (`sdk = "/path/to/sluice/sdk"`); its `[tool.pytest.ini_options]`
//! puts the SDK on the path so that a plain `pytest` runs the policy's tests
//! without Wasm. The build calls `componentize-py` (DESIGN.md, toolchain facts:
//! 0.25, from PyPI) for the world `policy-with-status` of the checkout's
//! `wit/`, then records the policy's `OBSERVES` in the `sluice:hints` section.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use sluice_core::runtime;

use super::build::COMPONENT_HEADER;

/// The componentize-py `pip` installs when the venv has none (the version the
/// host's WASI 0.2 support was tested with).
pub const COMPONENTIZE_PY: &str = "componentize-py==0.25.*";

/// The world Python policies are built for (with `status`, like the Rust SDK's).
const WORLD: &str = "policy-with-status";

/// `pyproject.toml`'s `[tool.sluice]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SluiceTable {
    /// `module = "my_policy"`: the module (`my_policy.py` in the directory) whose
    /// `WitWorld` is the component's export.
    module: String,
    /// `sdk = "../sdk"`: the sluice SDK directory (holding `python/` and, beside it,
    /// `../wit`); relative to the policy directory. Default: the checkout this
    /// `sluice` was built from.
    sdk: Option<PathBuf>,
}

/// Whether `dir` holds a Python policy (a `pyproject.toml` with `[tool.sluice]`).
pub fn is_python_policy(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("pyproject.toml")).is_ok_and(|t| t.contains("[tool.sluice]"))
}

fn read_table(dir: &Path) -> Result<SluiceTable> {
    let path = dir.join("pyproject.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    #[derive(Deserialize)]
    struct Tool {
        sluice: Option<SluiceTable>,
    }
    #[derive(Deserialize)]
    struct PyProject {
        tool: Option<Tool>,
    }
    let parsed: PyProject = toml::from_str(&text).with_context(|| format!("{}: not valid TOML", path.display()))?;
    parsed
        .tool
        .and_then(|t| t.sluice)
        .with_context(|| format!("{}: no [tool.sluice] table (`module = \"my_policy\"`)", path.display()))
}

/// The project venv: `$VIRTUAL_ENV` when one is active, else `.venv` of the sluice
/// checkout whose SDK is `sdk` (what `cargo xtask setup` creates).
pub fn venv(sdk: &Path) -> PathBuf {
    match std::env::var_os("VIRTUAL_ENV") {
        Some(v) => PathBuf::from(v),
        None => sdk.join("../.venv"),
    }
}

/// `componentize-py` in `venv`, installed from PyPI when it is missing (the venv
/// itself is made first when there is none).
pub fn componentize_py(venv: &Path) -> Result<PathBuf> {
    let tool = venv.join("bin/componentize-py");
    if tool.exists() {
        return Ok(tool);
    }
    let python = venv.join("bin/python");
    if !python.exists() {
        eprintln!("creating the venv {} for componentize-py", venv.display());
        run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    }
    eprintln!("installing {COMPONENTIZE_PY} into {} (from PyPI)", venv.display());
    run(Command::new(&python).args(["-m", "pip", "install", "--quiet", COMPONENTIZE_PY]))?;
    if !tool.exists() {
        bail!("pip installed {COMPONENTIZE_PY} but {} is not there", tool.display());
    }
    Ok(tool)
}

fn run(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// Builds the Python policy in `dir` into `<dir>/build/<module>.wasm`; its path.
pub fn build(dir: &Path, default_sdk: &Path) -> Result<PathBuf> {
    let table = read_table(dir)?;
    let module = &table.module;
    if !dir.join(format!("{module}.py")).exists() {
        bail!("{}: [tool.sluice] module = {module:?}, but there is no {module}.py", dir.display());
    }
    let sdk = match &table.sdk {
        Some(s) => dir.join(s),
        None => default_sdk.to_path_buf(),
    };
    let (sdk_python, wit) = (sdk.join("python"), sdk.join("../wit"));
    if !sdk_python.join("sluice_policy/__init__.py").exists() || !wit.join("policy.wit").exists() {
        bail!(
            "no sluice Python SDK at {} (with wit/ beside it): set `sdk` in [tool.sluice] of {}",
            sdk.display(),
            dir.join("pyproject.toml").display()
        );
    }
    let venv = venv(&sdk);
    let tool = componentize_py(&venv)?;
    let out_dir = dir.join("build");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let out = out_dir.join(format!("{module}.wasm"));
    run(Command::new(&tool)
        .arg("--quiet")
        .arg("-d")
        .arg(&wit)
        .args(["-w", WORLD, "componentize", module, "-p"])
        .arg(dir)
        .arg("-p")
        .arg(&sdk_python)
        .arg("-o")
        .arg(&out))
    .context("componentize-py failed: does the module define `WitWorld = export(MyPolicy)`?")?;
    let bytes = std::fs::read(&out).with_context(|| format!("reading {}", out.display()))?;
    if !bytes.starts_with(&COMPONENT_HEADER) {
        bail!("{} is not a WebAssembly component", out.display());
    }
    let observes = observes(&venv, dir, &sdk_python, module)?;
    std::fs::write(&out, runtime::with_hints(&bytes, observes))
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// The policy's `OBSERVES` (whether the host must call `observe`), read by
/// importing the module natively with the committed bindings
/// (`sdk/python/bindings`).
fn observes(venv: &Path, dir: &Path, sdk_python: &Path, module: &str) -> Result<bool> {
    let path = std::env::join_paths([dir, sdk_python, &sdk_python.join("bindings")])?;
    let out = Command::new(venv.join("bin/python"))
        .env("PYTHONPATH", path)
        .args(["-c", &format!("import {module} as m; print(bool(getattr(m.WitWorld, 'OBSERVES', True)))")])
        .output()
        .context("running python to read the policy's OBSERVES")?;
    if !out.status.success() {
        bail!("importing {module} natively failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim() != "False")
}

/// The files of a new Python policy `name` using the SDK at `sdk` (absolute):
/// (relative path, contents).
pub fn files(name: &str, sdk: &Path) -> Result<Vec<(String, String)>> {
    let class = super::new::type_name(name)?;
    let module = name.replace('-', "_");
    let sdk_python = sdk.join("python");
    let pyproject = format!(
        "# A sluice policy in Python, made by `sluice policy new --lang python {name}`.\n\
         # Test: `pytest` (no Wasm). Build: `sluice policy build` (componentize-py).\n\
         # See docs/writing-a-policy.md in the sluice checkout.\n\
         [project]\nname = {name:?}\nversion = \"0.1.0\"\nrequires-python = \">=3.11\"\n\n\
         [tool.sluice]\nmodule = {module:?}\nsdk = {sdk:?}\n\n\
         [tool.pytest.ini_options]\npythonpath = [\".\", {p:?}, {b:?}]\n",
        sdk = sdk.display().to_string(),
        p = sdk_python.display().to_string(),
        b = sdk_python.join("bindings").display().to_string(),
    );
    let policy = TEMPLATE.replace("Template", &class).replace("template", name);
    let test = TEST_TEMPLATE.replace("Template", &class).replace("template_module", &module);
    Ok(vec![
        ("pyproject.toml".into(), pyproject),
        (format!("{module}.py"), policy),
        (format!("test_{module}.py"), test),
        (".gitignore".into(), "build/\n__pycache__/\n".into()),
    ])
}

const TEMPLATE: &str = r#""""template: serve the head of the queue with the most accurate loaded model whose
batch fits in the slack of the oldest request; never drop."""

from sluice_policy import Decision, Level, Policy, export, largest_batch_within, log, most_accurate


class Template(Policy):
    # `observe` does nothing here: the host need not call it after each batch.
    OBSERVES = False

    def __init__(self, config):
        self.config = config
        # Parameters come parsed; refuse unknown ones with a message naming them.
        config.check_params("template", ["max_batch"])
        self.max_batch = config.params.get("max_batch", 32)
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError("template: param `max_batch` must be a positive integer")
        log(Level.INFO, f"template: {len(config.models)} models, SLO {config.slo} us")

    def decide(self, view):
        if not view.queue:
            return Decision.idle()
        model = most_accurate(self.config.models, view.loaded)
        if model is None:
            return Decision.idle()
        slack = view.queue[0].deadline - view.now
        batch = max(largest_batch_within(model, slack, self.max_batch), 1)
        return Decision.serve_head(model.id, min(batch, len(view.queue)))


WitWorld = export(Template)
"#;

const TEST_TEMPLATE: &str = r#""""Unit tests of the policy's logic: plain pytest, no Wasm."""

from sluice_policy import Decision
from sluice_policy.testing import Harness, config, linear_model, pending

from template_module import Template


def models():
    return [linear_model(0, "small", 0.7, 5_000, 1_000, 32), linear_model(1, "large", 0.8, 20_000, 4_000, 32)]


def test_serves_the_head_with_the_most_accurate_model():
    h = Harness(Template, config(100_000, models()))
    view = h.view(now=0, load_qps=100.0, queue=[pending(i, 0, 100_000) for i in range(4)])
    assert h.decide(view) == Decision.serve_head(1, 4)


def test_idles_on_an_empty_queue():
    h = Harness(Template, config(100_000, models()))
    assert h.decide(h.view(now=0, load_qps=0.0, queue=[])) == Decision.idle()


def test_unknown_params_are_refused_by_name():
    err = Harness.init_error(Template, config(100_000, models(), '{"max_btch": 4}'))
    assert "max_btch" in err
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_name_the_module_and_the_sdk() {
        let files = files("my-policy", Path::new("/opt/sluice/sdk")).unwrap();
        let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["pyproject.toml", "my_policy.py", "test_my_policy.py", ".gitignore"]);
        let pyproject = &files[0].1;
        assert!(pyproject.contains("module = \"my_policy\"") && pyproject.contains("/opt/sluice/sdk/python"));
        let parsed: toml::Value = toml::from_str(pyproject).unwrap();
        assert_eq!(parsed["tool"]["sluice"]["module"].as_str(), Some("my_policy"));
        assert!(files[1].1.contains("class MyPolicy(Policy)") && files[1].1.contains("WitWorld = export(MyPolicy)"));
        assert!(files[2].1.contains("from my_policy import MyPolicy"));
        assert!(!files.iter().any(|(_, t)| t.contains("Template") || t.contains("template")));
    }
}
