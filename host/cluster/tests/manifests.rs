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
//!   member, and agents and frontends have readiness probes and a PreStop hook; the
//!   accelerator pool requests `nvidia.com/gpu`;
//! - `kustomization.yaml` lists exactly the other files; with kubectl installed,
//!   `kubectl kustomize` renders them;
//! - every resource validates, strictly (an unknown field anywhere fails), against
//!   the official OpenAPI schemas of Kubernetes 1.29 and 1.37, by
//!   `kubernetes-validate` (PyPI, schemas bundled: no server, no network), which
//!   `cargo xtask setup` installs into the project venv.
//!
//! Not checked: anything only an API server knows (admission, quotas, CRDs, whether
//! the image exists).

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

fn docs() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for f in files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for d in serde_yaml::Deserializer::from_str(&text) {
            let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            if !v.is_null() {
                out.push((name.clone(), v));
            }
        }
    }
    out
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
            for probe in ["readinessProbe", "livenessProbe"] {
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
                if devices.split(',').any(|d| d != "cpu") {
                    assert!(
                        s(c, &["resources", "limits", "nvidia.com/gpu"]).is_some(),
                        "{what}: an accelerator pool must request nvidia.com/gpu"
                    );
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
