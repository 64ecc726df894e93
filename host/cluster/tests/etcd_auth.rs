//! etcd with its authentication on (a `root` user and a `sluice` user whose role
//! reads and writes `/sluice/` only, set up through etcd-client's auth API as
//! deploy/kubernetes's `etcd-auth` Job does with etcdctl): a role's connection with
//! the right credentials works, through a member's restart (etcd forgets its tokens:
//! the client authenticates again); one without credentials, with a wrong password,
//! or outside its prefix is refused with an error naming etcd's authentication.
//!
//! Its own test binary: it is the one test here that reads the process's
//! environment (`EtcdCredentials::from_env`, as `sluice serve --role` does).

use std::time::Duration;

use sluice_cluster::etcd_process::EtcdCluster;
use sluice_cluster::roles::{Role, RoleOptions};
use sluice_cluster::store::{EtcdCredentials, EtcdStore, EventKind, Store, StoreError, ENV_PASSWORD_FILE, ENV_USER};

fn options(etcd: &EtcdCluster) -> RoleOptions {
    RoleOptions {
        role: Role::Allocator,
        etcd: etcd.endpoints(),
        id: Some("alloc1".into()),
        devices: vec![],
        advertise: None,
        lease_ttl_s: 2,
        batch_timeout: Duration::from_secs(2),
        prefix: "/sluice/v1".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_credentials_a_role_works_without_them_it_is_refused_naming_etcd_auth() {
    let dir = tempfile::tempdir().unwrap();
    // Tokens forgotten after 1 s unused (etcd's default is 300 s), so that the test
    // sees etcd refuse a token it gave: what a member that restarted after a
    // snapshot, or an expired `jwt` token, gives a long-running role.
    let mut etcd = EtcdCluster::start_with(dir.path(), 1, &[], &["--auth-token-ttl=1"]).await.unwrap();
    let sluice = EtcdCredentials { user: "sluice".into(), password: "s3cret pass".into() };
    etcd.enable_auth("r00t", &sluice, "/sluice/").await.unwrap();

    // The credentials as a role reads them: a user and a password file (its
    // trailing newline is no part of the password).
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "s3cret pass\n").unwrap();
    let vars = |user: Option<&'static str>| {
        let file = password_file.display().to_string();
        move |k: &str| match k {
            ENV_USER => user.map(str::to_string),
            ENV_PASSWORD_FILE => Some(file.clone()),
            _ => None,
        }
    };
    let read = EtcdCredentials::from_vars(vars(Some("sluice"))).unwrap();
    assert_eq!(read.as_ref(), Some(&sluice));
    let err = EtcdCredentials::from_vars(vars(None)).unwrap_err();
    assert!(err.to_string().contains(ENV_USER), "{err}");

    // The right credentials: the role's connection reads and writes its keys.
    let role = options(&etcd);
    let store = sluice_cluster::roles::connect(&role, Some(&sluice)).await.unwrap();
    let rev = store.put("/sluice/v1/t", b"one".to_vec(), None).await.unwrap();
    assert_eq!(store.get("/sluice/v1/t").await.unwrap().unwrap().mod_revision, rev);
    let lease = store.grant(5).await.unwrap();
    store.keep_alive(lease).await.unwrap();
    let mut watch = store.watch("/sluice/v1/", rev + 1).await.unwrap();
    // Outside its prefix: refused by etcd's authorisation, named as such.
    match store.put("/other", b"x".to_vec(), None).await {
        Err(StoreError::Auth(m)) => assert!(m.contains("permission denied"), "{m}"),
        other => panic!("a put outside /sluice/ should be refused: {other:?}"),
    }

    // No credentials: refused at once with etcd's reason and what to set.
    let err = sluice_cluster::roles::connect(&role, None).await.err().expect("refused without credentials");
    let text = format!("{err:#}");
    assert!(text.contains("etcd auth") && text.contains(ENV_USER), "{text}");
    // A wrong password: refused when connecting.
    let wrong = EtcdCredentials { user: "sluice".into(), password: "guess".into() };
    match EtcdStore::connect_as(&etcd.endpoints(), Some(&wrong)).await {
        Err(StoreError::Auth(m)) => assert!(m.contains("authentication failed"), "{m}"),
        Err(e) => panic!("expected an auth refusal, got {e}"),
        Ok(_) => panic!("a wrong password should be refused"),
    }
    // The whole role, as `sluice serve --role` runs it, credentials from the
    // environment: without them it ends at once naming etcd's authentication.
    std::env::remove_var(ENV_USER);
    let config_text = sluice_cluster::harness::config_text(dir.path(), dir.path(), 2, 200, 1.0);
    std::fs::write(dir.path().join("emulated.toml"), sluice_cluster::harness::emulated_profile(1.0)).unwrap();
    let config = sluice_server::config::Config::parse(&config_text, "cluster.toml", dir.path()).unwrap();
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        sluice_cluster::roles::serve(config.clone(), role.clone(), std::future::pending()),
    )
    .await
    .expect("a refused role ends at once");
    let text = format!("{:#}", ended.expect_err("refused"));
    assert!(text.contains("etcd auth"), "{text}");
    // With them, it campaigns and leads (its id under the election key).
    std::env::set_var(ENV_USER, "sluice");
    std::env::set_var(ENV_PASSWORD_FILE, &password_file);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(sluice_cluster::roles::serve(config, role.clone(), async move {
        let _ = stopped.await;
    }));
    let election = sluice_cluster::keys::Keys::new(&role.prefix).election();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(kv)) = store.get(&election).await {
            assert_eq!(kv.value, b"alloc1");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the allocator was not elected within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), running).await.unwrap().unwrap().unwrap();

    // A token etcd no longer knows (unused for longer than its TTL): the store
    // authenticates again on "invalid auth token" and the call goes through.
    let direct = etcd.store_as(&sluice).await.unwrap();
    direct.get("/sluice/v1/t").await.unwrap();
    assert_eq!(direct.reauthenticated(), 0);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    direct.get("/sluice/v1/t").await.expect("authenticated again");
    assert!(direct.reauthenticated() >= 1, "etcd forgot the idle token: a new one was needed");
    // A member's restart: calls and the watch (re-opened on the restarted member,
    // with a new token where the old one is gone) go on.
    etcd.kill(0);
    etcd.restart(0).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let rev2 = loop {
        match direct.put("/sluice/v1/t", b"two".to_vec(), None).await {
            Ok(r) => break r,
            Err(StoreError::Unavailable(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("after the restart: {e}"),
        }
    };
    assert!(rev2 > rev);
    store.get("/sluice/v1/t").await.expect("the role's store too, after authenticating again");
    let mut seen: Vec<Vec<u8>> = Vec::new();
    while !seen.iter().any(|v| v == b"two") {
        let ev = tokio::time::timeout(Duration::from_secs(20), watch.next())
            .await
            .expect("the watch resumes within 20 s")
            .expect("open")
            .unwrap();
        if ev.kv.key == "/sluice/v1/t" && ev.kind == EventKind::Put {
            seen.push(ev.kv.value);
        }
    }
}
