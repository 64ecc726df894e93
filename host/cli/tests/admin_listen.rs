//! `admin_listen`: the admin API on an address of its own. The real `sluice serve`
//! process, both listeners on loopback.

use std::path::Path;

use sluice_loadgen::Client;

mod common;

#[test]
fn the_admin_api_is_served_only_on_its_own_listener() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token = \"t\"\nbuiltin_policy_dir = \"{root}/target/policies\"\npolicy_dir = \"{dir}/p\"\n\n\
         [[app]]\nname = \"emu\"\nslo_ms = 100\nworkers = 1\nexecutor = \"emulated\"\nprofile = \"{root}/examples/profiles/zero-latency.toml\"\n\
         policy = \"jellyfish\"\ninput = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\n",
        root = root.display(),
        dir = dir.path().display()
    );
    let (mut child, mut out) = common::serve(&config, dir.path());
    let main = common::address(&mut out, "sluice listening on http://");
    let admin = common::address(&mut out, "sluice admin listening on http://");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(async {
            let auth = [("authorization", "Bearer t")];
            let mut m = Client::connect(main).await.unwrap();
            let mut a = Client::connect(admin).await.unwrap();
            // The admin API answers on its listener, not on the clients' one.
            assert_eq!(a.request("GET", "/admin/apps/emu", &auth, b"").await.unwrap().status, 200);
            assert_eq!(m.request("GET", "/admin/apps/emu", &auth, b"").await.unwrap().status, 404);
            // So is the dashboard (the page, and the data it polls).
            assert_eq!(a.get("/dashboard").await.unwrap().status, 200);
            assert_eq!(a.request("GET", "/admin/dashboard", &auth, b"").await.unwrap().status, 200);
            assert_eq!(m.get("/dashboard").await.unwrap().status, 404);
            // Inference is the clients' listener's; metrics are on both.
            let body = serde_json::json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4] }] });
            assert_eq!(m.post_json("/v2/models/emu/infer", &body).await.unwrap().status, 200);
            let r = a.post_json("/v2/models/emu/infer", &body).await.unwrap();
            assert_eq!(r.status, 404);
            assert!(r.json()["error"].as_str().unwrap().contains("admin listener"), "{}", r.json());
            assert_eq!(a.get("/metrics").await.unwrap().status, 200);
            assert_eq!(m.get("/metrics").await.unwrap().status, 200);
        })
    }));
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
