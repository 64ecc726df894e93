//! deploy/kubernetes's `etcd-auth` Job run against a real etcd: its containers'
//! `command` and `args` taken from the manifest as written, `$(VAR)` expanded as the
//! kubelet does, with the environment its pod spec gives them (the Secret's keys as
//! test passwords, `ETCDCTL_ENDPOINTS` pointed at a local 3-member etcd on loopback),
//! run with this machine's `sh` and Debian's `etcdctl` (`etcd-client`, installed by
//! `cargo xtask setup`). Then, through sluice's own store client with the
//! credentials a role reads (`SLUICE_ETCD_USER`, `SLUICE_ETCD_PASSWORD`): the `sluice`
//! user reads and writes under `/sluice/` and nowhere else, and a client without
//! credentials or with a wrong password is refused. A Job is retried and may be
//! applied again, so the Job runs three more times and must succeed each time: again
//! as it is (one member down meanwhile), from a half-done state (authentication off,
//! the `sluice` user gone) with the Secret's `sluice` password rotated, and with
//! Secrets it must refuse (a wrong root password, a password with a space).
//!
//! What this does not run: Kubernetes itself (the kubelet's container start, the
//! Secret's projection, the NetworkPolicy) and the image's etcdctl 3.5 (the commands
//! the script uses are the same in 3.4 and 3.5; docs/cluster.md, "etcd access").

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_yaml::Value;
use sluice_cluster::etcd_process::{etcd_binary, EtcdCluster};
use sluice_cluster::store::{EtcdCredentials, EtcdStore, Store, StoreError, ENV_PASSWORD, ENV_USER};

/// The Job's manifest.
fn job() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/etcd-auth.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let job: Value = serde_yaml::from_str(&text).expect("etcd-auth.yaml is one YAML document");
    assert_eq!(job["kind"].as_str(), Some("Job"), "etcd-auth.yaml: a Job");
    job
}

/// The pod's containers in the order the kubelet runs them: init containers, then
/// the container (the Job's has one: more would run side by side).
fn containers(job: &Value) -> Vec<&Value> {
    let pod = &job["spec"]["template"]["spec"];
    let of = |key: &str| pod[key].as_sequence().map(|s| s.iter().collect::<Vec<_>>()).unwrap_or_default();
    let main = of("containers");
    assert_eq!(main.len(), 1, "etcd-auth: one container (several would run at the same time)");
    of("initContainers").into_iter().chain(main).collect()
}

/// `$(VAR)` references expanded as the kubelet expands a container's command, args
/// and env values (k8s.io/kubernetes third_party/forked/golang/expansion): a defined
/// VAR is replaced, an undefined one is left as written, `$$` is a literal `$`.
fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after.strip_prefix('(').and_then(|a| a.split_once(')')) {
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// What a Job's run printed, and whether every container exited 0.
struct Run {
    ok: bool,
    output: String,
}

/// Runs the Job's containers in order, as written, against `endpoints` with the
/// Secret `secret` (its keys and values): each container's environment is its pod
/// spec's `env`, a Secret's key given its value here and `ETCDCTL_ENDPOINTS` the test's
/// members (the manifest's must name the StatefulSet's three). Stops at the first
/// container that fails, as the kubelet does before restarting it.
fn run_job(job: &Value, endpoints: &[String], secret: &BTreeMap<&str, &str>) -> Run {
    let etcdctl = etcd_binary().with_file_name("etcdctl");
    assert!(
        etcdctl.exists(),
        "etcdctl not found at {} (install etcd-client: cargo xtask setup; beside ETCD_BIN otherwise)",
        etcdctl.display()
    );
    // The image runs etcdctl from its PATH; here, Debian's.
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", etcdctl.parent().unwrap().display());
    let mut output = String::new();
    for c in containers(job) {
        let name = c["name"].as_str().unwrap_or("?");
        let mut env = BTreeMap::new();
        for e in c["env"].as_sequence().into_iter().flatten() {
            let var = e["name"].as_str().expect("env name").to_string();
            let value = if var == "ETCDCTL_ENDPOINTS" {
                let members: Vec<String> = (0..3).map(|i| format!("http://etcd-{i}.etcd:2379")).collect();
                assert_eq!(e["value"].as_str(), Some(members.join(",").as_str()), "{name}: every etcd member");
                endpoints.join(",")
            } else if let Some(v) = e["value"].as_str() {
                expand(v, &env)
            } else if let Some(key) = e["valueFrom"]["secretKeyRef"]["key"].as_str() {
                assert_eq!(e["valueFrom"]["secretKeyRef"]["name"].as_str(), Some("sluice-etcd-auth"), "{name}: {var}");
                secret.get(key).unwrap_or_else(|| panic!("{name}: {var} from unknown key {key}")).to_string()
            } else {
                panic!("{name}: env {var}: only values and secretKeyRefs are given here: {e:?}");
            };
            env.insert(var, value);
        }
        let argv: Vec<String> = c["command"]
            .as_sequence()
            .into_iter()
            .chain(c["args"].as_sequence())
            .flatten()
            .map(|a| expand(a.as_str().expect("command and args are strings"), &env))
            .collect();
        assert!(!argv.is_empty(), "{name}: a command (the image's entrypoint is not known here)");
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", &path)
            .envs(&env)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{name}: {}: {e}", argv[0]));
        output.push_str(&format!(
            "[{name}] {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
        if !out.status.success() {
            return Run { ok: false, output };
        }
    }
    Run { ok: true, output }
}

/// How many times a test runs the Job's pod when a try fails on a passing etcd
/// condition (the manifest's `backoffLimit` allows 10).
const JOB_TRIES: u32 = 3;

/// Whether a failed try ended on a condition that passes on its own, the reason
/// the Job retries: etcdctl's last `Error:` line names a leader change, a timeout
/// or no leader (in a test that kills a member, a new election). "already exists"
/// is not one: the script must take that as done.
fn passing_etcd_condition(output: &str) -> bool {
    let Some(error) = output.lines().rev().find(|l| l.starts_with("Error:")) else { return false };
    ["leader changed", "timed out", "deadline exceeded", "no leader", "Unavailable"]
        .iter()
        .any(|passing| error.contains(passing))
}

/// The `sluice` user's credentials as a role reads them from its environment.
fn sluice_credentials(password: &str) -> EtcdCredentials {
    let vars = |k: &str| match k {
        ENV_USER => Some("sluice".to_string()),
        ENV_PASSWORD => Some(password.to_string()),
        _ => None,
    };
    EtcdCredentials::from_vars(vars).unwrap().expect("credentials")
}

/// `result` is etcd's authentication refusing, saying `says`.
fn refused<T: std::fmt::Debug>(result: Result<T, StoreError>, says: &str, what: &str) {
    match result {
        Err(StoreError::Auth(m)) => assert!(m.contains(says), "{what}: refused, but not `{says}`: {m}"),
        other => panic!("{what}: should be refused ({says}): {other:?}"),
    }
}

/// What the Job must leave: `sluice` with `password` reads and writes under
/// `/sluice/` and nothing else; no credentials, or a wrong password, get nothing.
async fn check_access(endpoints: &[String], password: &str, when: &str) {
    let store = EtcdStore::connect_as(endpoints, Some(&sluice_credentials(password)))
        .await
        .unwrap_or_else(|e| panic!("{when}: the sluice user authenticates: {e}"));
    let key = "/sluice/v1/etcd-auth-job";
    let rev = store.put(key, when.as_bytes().to_vec(), None).await.unwrap();
    let got = store.get(key).await.unwrap().expect("the key just put");
    assert_eq!((got.value.as_slice(), got.mod_revision), (when.as_bytes(), rev), "{when}");
    assert!(store.list("/sluice/").await.unwrap().kvs.iter().any(|kv| kv.key == key), "{when}: listing /sluice/");
    // Outside /sluice/, "/sluicex" included (the grant is the prefix with its slash).
    for outside in ["/other", "/sluicex", "/"] {
        refused(store.put(outside, b"x".to_vec(), None).await, "permission denied", &format!("{when}: put {outside}"));
        refused(store.get(outside).await, "permission denied", &format!("{when}: get {outside}"));
    }
    // No credentials: every call refused.
    let anonymous = EtcdStore::connect(endpoints).await.unwrap();
    refused(anonymous.get(key).await, "user name is empty", &format!("{when}: a read without credentials"));
    refused(
        anonymous.put(key, b"x".to_vec(), None).await,
        "user name is empty",
        &format!("{when}: a write without credentials"),
    );
    // A wrong password: refused when connecting.
    let wrong = EtcdStore::connect_as(endpoints, Some(&sluice_credentials("not-the-password"))).await;
    refused(wrong.map(|_| ()), "authentication failed", &format!("{when}: a wrong password"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_auth_job_as_written_secures_a_real_etcd_and_can_run_again() {
    let job = job();
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = EtcdCluster::start(dir.path(), 3).await.unwrap();
    let endpoints = etcd.endpoints();
    let secret = BTreeMap::from([("root-password", "r00t-pass"), ("sluice-password", "s1uice-pass")]);
    let job_run = |secret: BTreeMap<&'static str, &'static str>| {
        let (job, endpoints) = (job.clone(), endpoints.clone());
        tokio::task::spawn_blocking(move || run_job(&job, &endpoints, &secret))
    };
    // As the Job does (`restartPolicy: OnFailure`): a pod that failed on a passing
    // etcd condition runs again. Only on such a condition: a script that is not
    // idempotent fails every try, each try's output kept for the message.
    let job_retried = |secret: BTreeMap<&'static str, &'static str>| {
        let (job, endpoints) = (job.clone(), endpoints.clone());
        tokio::task::spawn_blocking(move || {
            let mut tries = String::new();
            for attempt in 1..=JOB_TRIES {
                let run = run_job(&job, &endpoints, &secret);
                tries.push_str(&format!("--- try {attempt}\n{}", run.output));
                if run.ok || !passing_etcd_condition(&run.output) {
                    return Run { ok: run.ok, output: tries };
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Run { ok: false, output: tries }
        })
    };

    // Before the Job, anyone may write anywhere.
    let anonymous = EtcdStore::connect(&endpoints).await.unwrap();
    anonymous.put("/other", b"before".to_vec(), None).await.expect("no authentication before the Job");

    // 1. The first run.
    let run = job_retried(secret.clone()).await.unwrap();
    assert!(run.ok, "the Job's first run failed:\n{}", run.output);
    check_access(&endpoints, "s1uice-pass", "after the first run").await;
    refused(anonymous.get("/other").await, "user name is empty", "the connection opened before the Job");

    // 2. Again, as a retried or re-applied Job, with one member down (a quorum
    //    answers). A role connected meanwhile keeps working: the password is set
    //    again, which makes etcd drop the user's tokens, and the store authenticates
    //    again on "invalid auth token".
    let role = EtcdStore::connect_as(&endpoints, Some(&sluice_credentials("s1uice-pass"))).await.unwrap();
    role.put("/sluice/v1/role", b"1".to_vec(), None).await.unwrap();
    etcd.kill(2);
    let run = job_retried(secret.clone()).await.unwrap();
    assert!(run.ok, "the Job's second run failed (it must be idempotent: Jobs are retried):\n{}", run.output);
    etcd.restart(2).unwrap();
    // Back (`wait_ready` reads without credentials, which etcd now refuses).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let member = &etcd.members[2].client_url;
    loop {
        let store = EtcdStore::connect_as(std::slice::from_ref(member), Some(&sluice_credentials("s1uice-pass"))).await;
        if let Ok(store) = store {
            if store.get("/sluice/v1/role").await.is_ok() {
                break;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "member 2 did not answer within 30 s of its restart");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    check_access(&endpoints, "s1uice-pass", "after the second run").await;
    role.put("/sluice/v1/role", b"2".to_vec(), None).await.expect("a role connected before the second run");
    assert!(
        role.reauthenticated() >= 1,
        "the password set again (and the restart) dropped its token: it authenticated again"
    );

    // 3. From a half-done state (authentication off, the sluice user gone: a pod lost
    //    half-way through an earlier attempt, or an operator's repair), with the
    //    Secret's sluice password rotated: the Job finishes the set-up, with the new
    //    password, and the old one is refused.
    let root = etcd_client::ConnectOptions::new().with_user("root", "r00t-pass");
    let mut admin = etcd_client::Client::connect(&endpoints, Some(root)).await.unwrap();
    admin.auth_disable().await.unwrap();
    drop(admin);
    // With authentication off etcd drops its tokens: the next calls go without.
    let mut anyone = etcd_client::Client::connect(&endpoints, None).await.unwrap();
    anyone.user_delete("sluice").await.unwrap();
    anyone.put("/other", "half-done", None).await.expect("authentication is off");
    let rotated = BTreeMap::from([("root-password", "r00t-pass"), ("sluice-password", "r0tated-pass")]);
    let run = job_retried(rotated).await.unwrap();
    assert!(run.ok, "the Job from a half-done state failed:\n{}", run.output);
    check_access(&endpoints, "r0tated-pass", "after a run from a half-done state").await;
    let old = EtcdStore::connect_as(&endpoints, Some(&sluice_credentials("s1uice-pass"))).await;
    refused(old.map(|_| ()), "authentication failed", "the password before the rotation");

    // 4. Secrets it must refuse, leaving etcd as it was: a root password that is not
    //    etcd's (etcd's reason in the log), and a password etcdctl would cut at its
    //    first space.
    let wrong_root = BTreeMap::from([("root-password", "guess"), ("sluice-password", "r0tated-pass")]);
    let run = job_run(wrong_root).await.unwrap();
    assert!(!run.ok && run.output.contains("authentication failed"), "a wrong root password:\n{}", run.output);
    let spaced = BTreeMap::from([("root-password", "r00t-pass"), ("sluice-password", "two words")]);
    let run = job_run(spaced).await.unwrap();
    assert!(!run.ok && run.output.contains("white space"), "a password with a space:\n{}", run.output);
    check_access(&endpoints, "r0tated-pass", "after the refused runs").await;
}

#[test]
fn kubelet_expansion_is_what_the_kubelet_does() {
    let env = BTreeMap::from([("A".to_string(), "x".to_string())]);
    assert_eq!(expand("$(A)-$(B)-$$(A)-$A-$", &env), "x-$(B)-$(A)-$A-$");
}
