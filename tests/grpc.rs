//! KServe v2 gRPC conformance: `tritonclient.grpc`, unchanged, against a real sluice
//! server (health, metadata, config, repository index, statistics, raw tensors, a
//! batch, an unknown model, a bad shape, overload → RESOURCE_EXHAUSTED with every
//! call answered once); and a tonic client for what tritonclient does not send
//! (typed contents, pinned versions, framing errors).

use serde_json::{json, Value};
use sluice_e2e::*;
use sluice_server::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice_server::grpc::proto::{
    model_infer_request::InferInputTensor, InferTensorContents, ModelInferRequest, ModelReadyRequest,
};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `emu` (zero latency) and `slow` (the 1× emulated profile, a short queue and SLO).
fn config() -> String {
    format!(
        "{}\n[[app]]\nname = \"slow\"\nexecutor = \"emulated\"\nprofile = \"{{dir}}/emulated.toml\"\n\
         input = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\nslo_ms = 20\nworkers = 1\nmax_queue = 4\n\
         policy = \"jellyfish\"\n",
        emu_app("zero", "slo_ms = 100\nworkers = 2\npolicy = \"jellyfish\"")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_grpc_unchanged() {
    let server = TestServer::start_with_grpc(&config()).await.unwrap();
    let python = root().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run `cargo xtask setup`", python.display());
    let calls = 40;
    let out = tokio::process::Command::new(&python)
        .arg(root().join("tests/grpc_client.py"))
        .args([&server.grpc.unwrap().to_string(), "emu", "x", "slow", &calls.to_string()])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "tritonclient.grpc failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();

    // Metadata: the variants are the versions; -1 is a batch of any size.
    assert_eq!(seen["meta"]["name"], json!("emu"));
    assert_eq!(seen["meta"]["versions"], json!(["small", "medium", "large"]));
    assert_eq!(seen["meta"]["inputs"][0], json!({ "name": "x", "datatype": "FP32", "shape": ["-1", "4"] }));
    assert_eq!(seen["config"]["max_batch_size"], json!(1024), "{}", seen["config"]);
    assert_eq!(seen["config"]["input"][0]["data_type"], json!("TYPE_FP32"));
    assert_eq!(seen["config"]["input"][0]["dims"], json!(["4"]));
    let index = seen["index"].as_array().unwrap();
    assert!(index.iter().any(|m| m["name"] == "emu" && m["state"] == "READY"), "{index:?}");
    assert!(seen["extensions"].as_array().unwrap().contains(&json!("statistics")));

    // One sample in raw bytes: the emulated output is [variant id, sum of the input].
    assert_eq!(seen["one"][0][1], json!(10.0), "{seen}");
    assert_eq!(seen["model_name"], json!("emu"));
    assert_eq!(seen["id"], json!("grpc-1"));
    assert!(seen["meta"]["versions"].as_array().unwrap().contains(&seen["model_version"]));
    // A batch of three: one row per sample, in order.
    let sums: Vec<f64> = seen["rows"].as_array().unwrap().iter().map(|r| r[1].as_f64().unwrap()).collect();
    assert_eq!(sums, vec![4.0, 8.0, 12.0]);

    // Errors: the codes, and the HTTP front's messages.
    assert_eq!(seen["unknown"]["status"], json!("StatusCode.NOT_FOUND"), "{}", seen["unknown"]);
    assert!(seen["unknown"]["message"].as_str().unwrap().contains("unknown app `no-such-app`"));
    assert_eq!(seen["unknown_meta"]["status"], json!("StatusCode.NOT_FOUND"));
    assert_eq!(seen["bad_shape"]["status"], json!("StatusCode.INVALID_ARGUMENT"));
    let msg = seen["bad_shape"]["message"].as_str().unwrap();
    assert!(msg.contains("input `x`: shape [1, 5] but the app expects [-1, 4]"), "{msg}");

    // Overload: some served, some refused RESOURCE_EXHAUSTED (a policy drop would be
    // DEADLINE_EXCEEDED), nothing else; every call answered once (the client
    // checked), and the server's counters agree with what the client saw.
    let codes = seen["codes"].as_object().unwrap();
    let count = |k: &str| codes.get(k).and_then(Value::as_u64).unwrap_or(0);
    let (ok, refused, dropped) =
        (count("OK"), count("StatusCode.RESOURCE_EXHAUSTED"), count("StatusCode.DEADLINE_EXCEEDED"));
    assert_eq!(ok + refused + dropped, calls, "unexpected codes: {codes:?}");
    assert!(ok >= 1 && refused >= 1, "{codes:?}");
    let c = &server.state.apps["slow"].counters;
    assert_eq!(c.served.load(Ordering::Relaxed), ok);
    assert_eq!(c.dropped.load(Ordering::Relaxed), dropped);
    assert_eq!(c.accepted.load(Ordering::Relaxed), ok + dropped);
    assert_eq!(c.rejected.load(Ordering::Relaxed), refused);

    // Statistics come from the counters: 1 + 3 samples served on `emu`.
    assert_eq!(seen["stats"]["name"], json!("emu"));
    assert_eq!(seen["stats"]["inference_count"], json!("4"), "{}", seen["stats"]);
    server.stop().await.unwrap();
}

fn typed(shape: Vec<i64>, values: Vec<f32>) -> InferInputTensor {
    InferInputTensor {
        name: "x".into(),
        datatype: "FP32".into(),
        shape,
        contents: Some(InferTensorContents { fp32_contents: values, ..Default::default() }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_contents_versions_and_framing_errors() {
    let server = TestServer::start_with_grpc(&config()).await.unwrap();
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc.unwrap())).await.unwrap();
    let request = |inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>| ModelInferRequest {
        model_name: "emu".into(),
        inputs,
        raw_input_contents: raw.into_iter().map(Into::into).collect(),
        ..Default::default()
    };

    // Typed contents in, typed contents out; a batch of two.
    let r = client
        .model_infer(request(vec![typed(vec![2, 4], vec![1., 1., 1., 1., 2., 2., 2., 2.])], vec![]))
        .await
        .unwrap()
        .into_inner();
    assert!(r.raw_output_contents.is_empty());
    assert_eq!(r.outputs[0].shape, vec![2, 2]);
    let out = &r.outputs[0].contents.as_ref().unwrap().fp32_contents;
    assert_eq!((out[1], out[3]), (4.0, 8.0));
    assert!(r.parameters.contains_key("latency_us") && r.parameters.contains_key("variants"));

    // What is wrong is named, with the HTTP front's words.
    let raw16: Vec<u8> = [1f32, 2., 3., 4.].iter().flat_map(|x| x.to_le_bytes()).collect();
    let cases: Vec<(ModelInferRequest, tonic::Code, &str)> = vec![
        (
            request(vec![typed(vec![1, 4], vec![1., 2., 3.])], vec![]),
            tonic::Code::InvalidArgument,
            "needs 4 elements, contents has 3",
        ),
        (
            request(vec![InferInputTensor { contents: None, ..typed(vec![1, 4], vec![]) }], vec![raw16[..12].to_vec()]),
            tonic::Code::InvalidArgument,
            "needs 16 bytes; raw_input_contents has 12",
        ),
        (
            request(vec![typed(vec![1, 4], vec![1., 2., 3., 4.])], vec![raw16.clone()]),
            tonic::Code::InvalidArgument,
            "both contents and raw_input_contents",
        ),
        (
            request(vec![InferInputTensor { contents: None, ..typed(vec![1, 4], vec![]) }], vec![]),
            tonic::Code::InvalidArgument,
            "no contents (nor raw_input_contents)",
        ),
        (
            request(
                vec![InferInputTensor { contents: None, ..typed(vec![1, 4], vec![]) }],
                vec![raw16.clone(), raw16.clone()],
            ),
            tonic::Code::InvalidArgument,
            "raw_input_contents has 2 entries for 1 inputs",
        ),
        (
            request(vec![typed(vec![2000, 4], vec![0.; 8000])], vec![]),
            tonic::Code::InvalidArgument,
            "a batch of 2000 samples; emu takes 1 to 1024 per request",
        ),
        (
            ModelInferRequest {
                model_version: "small".into(),
                ..request(vec![typed(vec![1, 4], vec![1., 2., 3., 4.])], vec![])
            },
            tonic::Code::InvalidArgument,
            "sluice's policy picks the variant",
        ),
        (
            ModelInferRequest {
                model_version: "huge".into(),
                ..request(vec![typed(vec![1, 4], vec![1., 2., 3., 4.])], vec![])
            },
            tonic::Code::NotFound,
            "emu has no version `huge`",
        ),
    ];
    for (req, code, needle) in cases {
        let e = client.model_infer(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{needle}: {}", e.message());
        assert!(e.message().contains(needle), "`{}` should mention `{needle}`", e.message());
    }
    // A variant's readiness: loaded on a worker.
    let ready = |version: &str| ModelReadyRequest { name: "emu".into(), version: version.into() };
    assert!(client.model_ready(ready("small")).await.unwrap().into_inner().ready);
    assert_eq!(client.model_ready(ready("huge")).await.unwrap_err().code(), tonic::Code::NotFound);

    // At shutdown the apps stop accepting: UNAVAILABLE, as HTTP's 503.
    for app in server.state.apps.values() {
        app.accepting.store(false, Ordering::Release);
    }
    let e = client.model_infer(request(vec![typed(vec![1, 4], vec![1., 2., 3., 4.])], vec![])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{}", e.message());
    for app in server.state.apps.values() {
        app.accepting.store(true, Ordering::Release);
    }
    let c = &server.state.apps["emu"].counters;
    assert_eq!(c.accepted.load(Ordering::Relaxed), c.served.load(Ordering::Relaxed));
    server.stop().await.unwrap();
}

/// Request bodies on both fronts share `body_budget_bytes`: while an HTTP request
/// that declared the whole budget is still sending its body, a gRPC call finds the
/// budget full and fails UNAVAILABLE with the HTTP front's words; once that body is
/// gone, the call is served, and what it took is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_bodies_count_against_the_shared_body_budget() {
    use tokio::io::AsyncWriteExt;
    let config = format!(
        "max_body_bytes = 65536\nbody_budget_bytes = 65536\n{}",
        emu_app("zero", "slo_ms = 100\nworkers = 1\npolicy = \"jellyfish\"")
    );
    let server = TestServer::start_with_grpc(&config).await.unwrap();
    let budget = server.state.body_budget.clone();
    let full = budget.available_permits();
    assert_eq!(full, 64);
    let wait_for = |want: usize| {
        let budget = budget.clone();
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while budget.available_permits() != want {
                assert!(
                    std::time::Instant::now() < deadline,
                    "budget at {} KiB, not {want}",
                    budget.available_permits()
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };
    let mut slow = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(
        b"POST /v2/models/emu/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 65536\r\n\r\n",
    )
    .await
    .unwrap();
    wait_for(0).await;

    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc.unwrap())).await.unwrap();
    let request = || ModelInferRequest {
        model_name: "emu".into(),
        inputs: vec![typed(vec![1, 4], vec![1., 2., 3., 4.])],
        ..Default::default()
    };
    let e = client.model_infer(request()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{}", e.message());
    assert!(e.message().contains("body_budget_bytes = 65536"), "{}", e.message());

    drop(slow);
    wait_for(full).await;
    let r = client.model_infer(request()).await.unwrap().into_inner();
    assert_eq!(r.model_name, "emu");
    wait_for(full).await;
    let c = &server.state.apps["emu"].counters;
    assert_eq!(c.accepted.load(Ordering::Relaxed), 1, "the refused call was never accepted");
    server.stop().await.unwrap();
}

/// hyper has no idle timeout for HTTP/2 and the keep-alive pings move bytes, so an
/// idle gRPC connection used to be held until its age bound (ten times
/// `idle_timeout_ms`). Now a connection with no call in progress for
/// `idle_timeout_ms` is closed and counted; a call longer than that is not cut;
/// the client's channel reconnects for its next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_grpc_connections_are_closed() {
    let profiles = tempfile::tempdir().unwrap();
    // `small` takes 500 ms at batch 1: longer than the idle timeout.
    let slow = profiles.path().join("slow.toml");
    std::fs::write(&slow, emulated_profile(500.0)).unwrap();
    let config = format!(
        "idle_timeout_ms = 200\n{}\n[[app]]\nname = \"slowcall\"\nexecutor = \"emulated\"\nprofile = \"{}\"\n\
         input = {{ name = \"x\", datatype = \"FP32\", shape = [4] }}\nslo_ms = 5000\nworkers = 1\n\
         policy = \"fixed\"\nparams = {{ model = \"small\" }}\n",
        emu_app("zero", "slo_ms = 100\nworkers = 1\npolicy = \"jellyfish\""),
        slow.display()
    );
    let server = TestServer::start_with_grpc(&config).await.unwrap();
    let idle_closed = || server.state.metrics.connections.idle_closed.load(Ordering::Relaxed);
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc.unwrap())).await.unwrap();
    let request = |model: &str| ModelInferRequest {
        model_name: model.into(),
        inputs: vec![typed(vec![1, 4], vec![1., 2., 3., 4.])],
        ..Default::default()
    };
    client.model_infer(request("emu")).await.unwrap();

    // A call that outlasts the idle timeout is answered, not cut.
    let before = idle_closed();
    let r = client.model_infer(request("slowcall")).await.unwrap().into_inner();
    assert_eq!(r.model_name, "slowcall");
    assert_eq!(idle_closed(), before, "the connection was closed while a call was in progress");

    // Then, idle, it is closed and counted.
    assert!(eventually(Duration::from_secs(5), || idle_closed() > before).await, "the idle connection stayed open");
    // The channel reconnects for the next call.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = client.model_infer(request("emu")).await.unwrap().into_inner();
    assert_eq!(r.model_name, "emu");
    server.stop().await.unwrap();
}
