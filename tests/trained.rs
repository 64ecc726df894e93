//! The trained ImageNet family behind the embedded default config: photographs with
//! a known class, sent over HTTP to a real server, come back classified correctly by
//! every variant (EfficientNet-Lite0/1/2), and the app advertises the variants'
//! published accuracies.
//!
//! The server runs in-process on `127.0.0.1:0` from `sluice_server::config::DEFAULT_CONFIG`
//! itself (what `sluice serve` with no `--config` and `cargo xtask demo` run), its
//! relative paths anchored at the repository root; only the admin token and the
//! uploaded-policy directory are the test's own.
//!
//! The photos and their classes come from `models/imagenet-trained/samples.{f32,json}`,
//! which `cargo xtask setup` writes (xtask/scripts/make_trained.py): Grace Hopper
//! (matplotlib's sample data; military uniform), Chelsea the cat and a cup of coffee
//! (scikit-image's data; tabby/tiger/Egyptian cat, espresso/cup), each cropped and
//! normalised in Python with the EfficientNet evaluation preprocessing. The cat and
//! the coffee must be top-1; Grace Hopper, whom these models share between military
//! uniform, academic gown, suit and Windsor tie, within the top 5 (`top` in
//! samples.json; make_trained.py explains the margins).

use serde_json::{json, Value};
use sluice_e2e::*;
use sluice_loadgen::Client;
use sluice_server::config::{Config, DEFAULT_CONFIG};

const VARIANTS: [&str; 3] = ["efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"];

/// A photo from samples.json with its tensor.
struct Photo {
    name: String,
    classes: Vec<u64>,
    top: usize,
    data: Vec<f32>,
}

fn photos() -> Vec<Photo> {
    let dir = root().join("models/imagenet-trained");
    let meta: Value = serde_json::from_slice(
        &std::fs::read(dir.join("samples.json"))
            .expect("models/imagenet-trained/samples.json: run `cargo xtask setup`"),
    )
    .unwrap();
    assert_eq!(meta["shape"], json!([1, 3, 260, 260]), "samples.json: the family's input");
    let bytes = std::fs::read(dir.join("samples.f32")).expect("models/imagenet-trained/samples.f32");
    let per = 3 * 260 * 260;
    let samples = meta["samples"].as_array().unwrap();
    assert_eq!(bytes.len(), samples.len() * per * 4, "samples.f32 holds one tensor per sample in samples.json");
    samples
        .iter()
        .enumerate()
        .map(|(i, s)| Photo {
            name: s["name"].as_str().unwrap().to_string(),
            classes: s["classes"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect(),
            top: s["top"].as_u64().unwrap() as usize,
            data: bytes[i * per * 4..(i + 1) * per * 4]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
        .collect()
}

/// The embedded default config served on `127.0.0.1:0`, with the test's own admin
/// token and uploaded-policy directory.
async fn start_default() -> TestServer {
    policies_dir(); // fails clearly when the built-in components are missing
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse(DEFAULT_CONFIG, "<embedded default config>", &root()).expect("the default parses");
    config.admin_token = Some(TOKEN.into());
    config.policy_dir = dir.path().join("policies");
    TestServer::serve(config, dir).await.expect("the default config's apps build")
}

/// Sends `photo` to the default app; returns the variant that served it and the
/// indices of its `top` most probable classes.
async fn classify(c: &mut Client, photo: &Photo, top: usize) -> (String, Vec<usize>) {
    let body = json!({
        "id": photo.name,
        "inputs": [{ "name": "image", "datatype": "FP32", "shape": [1, 3, 260, 260], "data": photo.data }],
    });
    let r = c.post_json("/v2/models/imagenet/infer", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}: {}", photo.name, String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["id"], json!(photo.name));
    let out = &v["outputs"][0];
    assert_eq!(out["shape"], json!([1, 1000]), "{}: 1000 ImageNet classes", photo.name);
    let probs: Vec<f64> = out["data"].as_array().unwrap().iter().map(|p| p.as_f64().unwrap()).collect();
    let sum: f64 = probs.iter().sum();
    assert!((sum - 1.0).abs() < 1e-3, "{}: a softmax sums to 1, got {sum}", photo.name);
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    order.truncate(top);
    (v["parameters"]["variant"].as_str().unwrap().to_string(), order)
}

fn check(photo: &Photo, variant: &str, top: &[usize]) {
    assert!(
        top[..photo.top].iter().any(|c| photo.classes.contains(&(*c as u64))),
        "{variant} on {}: top-{} {:?} holds none of {:?} (top-5 {top:?})",
        photo.name,
        photo.top,
        &top[..photo.top],
        photo.classes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_config_classifies_photos_with_every_trained_variant() {
    let photos = photos();
    let server = start_default().await;
    let mut c = server.client().await;

    // The app advertises the trained family with the published accuracies (what the
    // demo's loadgen averages and prints).
    let meta = c.get("/v2/models/imagenet").await.unwrap();
    assert_eq!(meta.status, 200);
    let meta = meta.json();
    assert_eq!(meta["inputs"][0]["name"], json!("image"));
    assert_eq!(meta["inputs"][0]["shape"], json!([-1, 3, 260, 260]), "{meta}");
    let advertised: Vec<(String, f64)> = meta["parameters"]["variants"]
        .as_array()
        .expect("variants in the model metadata")
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v["accuracy"].as_f64().unwrap()))
        .collect();
    assert_eq!(
        advertised,
        vec![
            ("efficientnet_lite0".to_string(), 0.751),
            ("efficientnet_lite1".to_string(), 0.767),
            ("efficientnet_lite2".to_string(), 0.776)
        ],
        "tensorflow/tpu's published top-1 for the Lite checkpoints"
    );

    // Under the default policy (jellyfish), whichever variant it picks.
    for photo in &photos {
        let (variant, top) = classify(&mut c, photo, 5).await;
        assert!(VARIANTS.contains(&variant.as_str()), "served by {variant}");
        check(photo, &variant, &top);
    }

    // Every variant, pinned with the `fixed` policy.
    for variant in VARIANTS {
        let r = swap(&mut c, "imagenet", "fixed", json!({ "model": variant })).await;
        assert_eq!(r.status, 200, "swap to fixed {variant}: {}", String::from_utf8_lossy(&r.body));
        for photo in &photos {
            let (served, top) = classify(&mut c, photo, 5).await;
            assert_eq!(served, variant, "`fixed` pins the variant");
            check(photo, variant, &top);
        }
    }

    server.stop().await.unwrap();
}

/// The classification extension on the trained family: `class_count` answers BYTES
/// `score:index:label` with ImageNet's names, from the `labels.txt` that `cargo
/// xtask setup` writes beside the models, and the model configuration names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_count_names_the_imagenet_classes() {
    let labels = std::fs::read_to_string(root().join("models/imagenet-trained/labels.txt"))
        .expect("models/imagenet-trained/labels.txt: run `cargo xtask setup`");
    let labels: Vec<&str> = labels.lines().collect();
    assert_eq!(labels.len(), 1000, "one name per ImageNet-1k class");
    assert_eq!((labels[0], labels[285], labels[967]), ("tench", "Egyptian cat", "espresso"));
    let photos = photos();
    let server = start_default().await;
    let mut c = server.client().await;
    let config = c.get("/v2/models/imagenet/config").await.unwrap().json();
    assert_eq!(config["output"][0]["label_filename"], json!("labels.txt"), "{config}");
    for photo in &photos {
        let body = json!({
            "inputs": [{ "name": "image", "datatype": "FP32", "shape": [1, 3, 260, 260], "data": photo.data }],
            "outputs": [{ "name": "output", "parameters": { "classification": 5 } }],
        });
        let r = c.post_json("/v2/models/imagenet/infer", &body).await.unwrap();
        assert_eq!(r.status, 200, "{}: {}", photo.name, String::from_utf8_lossy(&r.body));
        let v = r.json();
        let out = &v["outputs"][0];
        assert_eq!(out["datatype"], json!("BYTES"), "{v}");
        let top: Vec<(usize, String)> = out["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let mut parts = s.as_str().unwrap().splitn(3, ':');
                let (_score, index, label) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
                (index.parse().unwrap(), label.to_string())
            })
            .collect();
        assert_eq!(top.len(), 5, "{v}");
        for (index, label) in &top {
            assert_eq!(label, labels[*index], "{}: class {index} is named by labels.txt", photo.name);
        }
        let indices: Vec<usize> = top.iter().map(|t| t.0).collect();
        check(photo, v["parameters"]["variant"].as_str().unwrap(), &indices);
    }
    server.stop().await.unwrap();
}
