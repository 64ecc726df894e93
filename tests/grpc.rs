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

    // Statistics come from the counters: 1 + 3 samples served on `emu`; as Triton
    // reports them (a version that parses as an integer, compute phases alike).
    assert_eq!(seen["stats"]["name"], json!("emu"));
    assert_eq!(seen["stats"]["inference_count"], json!("4"), "{}", seen["stats"]);
    assert_eq!(seen["stats"]["version"], json!("1"), "{}", seen["stats"]);
    let phases = &seen["stats"]["inference_stats"];
    for phase in ["success", "queue", "compute_input", "compute_infer", "compute_output"] {
        assert_eq!(phases[phase]["count"], json!("4"), "{phase}: {phases}");
    }

    // Classes in raw BYTES: the emulated output is [variant id, 10].
    let top = seen["top"].as_array().unwrap();
    assert_eq!(seen["top_shape"], json!([1, 2]));
    assert_eq!(top[0], json!("10.000000:1"), "{top:?}");
    assert!(top[1].as_str().unwrap().ends_with(":0"), "{top:?}");
    for algorithm in ["gzip", "deflate"] {
        assert_eq!(seen["compressed"][algorithm][0][1], json!(10.0), "{algorithm}: {}", seen["compressed"]);
    }
    assert_eq!(seen["no_id"], json!("absent"));
    let stream = seen["stream_errors"].as_array().unwrap();
    assert!(stream.iter().any(|e| e.as_str().unwrap().contains("streaming inference is not supported")), "{stream:?}");
    for (call, needle) in [
        ("shm_register", "system shared memory is not supported"),
        ("shm_status", "system shared memory is not supported"),
        ("cuda_unregister", "CUDA shared memory is not supported"),
        ("load", "model repository control is not supported"),
        ("unload", "model repository control is not supported"),
        ("trace", "trace settings are not supported"),
        ("log", "log settings are not supported"),
    ] {
        let e = &seen["refused"][call];
        assert_eq!(e["status"], json!("StatusCode.UNIMPLEMENTED"), "{call}: {e}");
        assert!(e["message"].as_str().is_some_and(|m| m.contains(needle)), "{call}: {e}");
    }
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
    let reason = e.metadata().get("sluice-refusal-reason").map(|v| v.to_str().unwrap().to_string());
    assert_eq!(reason.as_deref(), Some("shutting-down"), "a refusal names its reason");
    for app in server.state.apps.values() {
        app.accepting.store(true, Ordering::Release);
    }
    let c = &server.state.apps["emu"].counters;
    assert_eq!(c.accepted.load(Ordering::Relaxed), c.served.load(Ordering::Relaxed));
    // Refused at admission, and counted as the client was answered: 503, rejected.
    let rejected = c.rejected.load(Ordering::Relaxed);
    assert!(rejected >= 1, "the refusal at shutdown is counted ({rejected})");
    let metrics = server.state.metrics.render();
    assert!(
        metrics.lines().any(|l| l.starts_with("sluice_requests_total{") && l.contains("rejected-shutdown")),
        "sluice_requests_total counts the 503:\n{metrics}"
    );
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

/// Every method of Triton's service is answered: those sluice does not serve with
/// UNIMPLEMENTED and a message naming what is not supported (Triton's C++ client
/// takes an empty message for success, so perf_analyzer once "registered" shared
/// memory); gzip-compressed requests are read, and one that inflates past
/// `max_body_bytes` is refused RESOURCE_EXHAUSTED while it inflates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_answers_and_compressed_requests_are_read() {
    use sluice_server::grpc::proto::*;
    let config =
        format!("max_body_bytes = 65536\n{}", emu_app("zero", "slo_ms = 100\nworkers = 1\npolicy = \"jellyfish\""));
    let server = TestServer::start_with_grpc(&config).await.unwrap();
    let url = format!("http://{}", server.grpc.unwrap());
    let mut client = GrpcInferenceServiceClient::connect(url.clone()).await.unwrap();
    let refused: Vec<(&str, tonic::Status, &str)> = vec![
        (
            "ModelStreamInfer",
            client.model_stream_infer(tokio_stream::iter(Vec::<ModelInferRequest>::new())).await.unwrap_err(),
            "streaming inference is not supported",
        ),
        (
            "RepositoryModelLoad",
            client
                .repository_model_load(RepositoryModelLoadRequest { model_name: "emu".into(), ..Default::default() })
                .await
                .unwrap_err(),
            "cannot load `emu`",
        ),
        (
            "RepositoryModelUnload",
            client.repository_model_unload(RepositoryModelUnloadRequest::default()).await.unwrap_err(),
            "model repository control is not supported",
        ),
        (
            "SystemSharedMemoryStatus",
            client.system_shared_memory_status(SystemSharedMemoryStatusRequest::default()).await.unwrap_err(),
            "system shared memory is not supported",
        ),
        (
            "SystemSharedMemoryRegister",
            client.system_shared_memory_register(SystemSharedMemoryRegisterRequest::default()).await.unwrap_err(),
            "nothing was registered",
        ),
        (
            "SystemSharedMemoryUnregister",
            client.system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest::default()).await.unwrap_err(),
            "system shared memory is not supported",
        ),
        (
            "CudaSharedMemoryStatus",
            client.cuda_shared_memory_status(CudaSharedMemoryStatusRequest::default()).await.unwrap_err(),
            "CUDA shared memory is not supported",
        ),
        (
            "CudaSharedMemoryRegister",
            client.cuda_shared_memory_register(CudaSharedMemoryRegisterRequest::default()).await.unwrap_err(),
            "CUDA shared memory is not supported",
        ),
        (
            "CudaSharedMemoryUnregister",
            client.cuda_shared_memory_unregister(CudaSharedMemoryUnregisterRequest::default()).await.unwrap_err(),
            "CUDA shared memory is not supported",
        ),
        (
            "TraceSetting",
            client.trace_setting(TraceSettingRequest::default()).await.unwrap_err(),
            "trace settings are not supported",
        ),
        (
            "LogSettings",
            client.log_settings(LogSettingsRequest::default()).await.unwrap_err(),
            "log settings are not supported",
        ),
    ];
    for (method, e, needle) in refused {
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{method}: {}", e.message());
        assert!(e.message().contains(needle), "{method}: `{}` should mention `{needle}`", e.message());
    }

    // Compressed requests: gzip and deflate, as tritonclient sends them.
    let request = |values: Vec<f32>| ModelInferRequest {
        model_name: "emu".into(),
        inputs: vec![InferInputTensor { contents: None, ..typed(vec![1, 4], vec![]) }],
        raw_input_contents: vec![values.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into()],
        ..Default::default()
    };
    for encoding in [tonic::codec::CompressionEncoding::Gzip, tonic::codec::CompressionEncoding::Deflate] {
        let mut compressed = GrpcInferenceServiceClient::connect(url.clone()).await.unwrap().send_compressed(encoding);
        let r = compressed.model_infer(request(vec![1., 2., 3., 4.])).await.unwrap().into_inner();
        let out: Vec<f32> =
            r.raw_output_contents[0].chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(out[1], 10.0, "{encoding:?}");
        // A bomb: 64 KiB of tensor in far fewer compressed bytes, past the limit once
        // inflated. Refused while inflating, and nothing admitted.
        let accepted = server.state.apps["emu"].counters.accepted.load(Ordering::Relaxed);
        let e = compressed
            .model_infer(ModelInferRequest {
                inputs: vec![InferInputTensor { contents: None, ..typed(vec![4096, 4], vec![]) }],
                ..request(vec![0.; 16384])
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{encoding:?}: {}", e.message());
        assert!(e.message().contains("size limit"), "{}", e.message());
        assert_eq!(server.state.apps["emu"].counters.accepted.load(Ordering::Relaxed), accepted);
    }
    // What the compressed calls took from the body budget is given back.
    let budget = server.state.body_budget.clone();
    assert!(eventually(Duration::from_secs(5), || budget.available_permits() == 256 * 1024).await);

    // Typed contents: classes come back in bytes_contents.
    let mut classes = request(vec![1., 2., 3., 4.]);
    classes.raw_input_contents.clear();
    classes.inputs = vec![typed(vec![1, 4], vec![1., 2., 3., 4.])];
    classes.outputs = vec![model_infer_request::InferRequestedOutputTensor {
        name: "output".into(),
        parameters: [(
            "classification".to_string(),
            InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::Int64Param(1)) },
        )]
        .into(),
    }];
    let r = client.model_infer(classes.clone()).await.unwrap().into_inner();
    assert_eq!((r.outputs[0].datatype.as_str(), r.outputs[0].shape.clone()), ("BYTES", vec![1, 1]));
    assert_eq!(r.outputs[0].contents.as_ref().unwrap().bytes_contents, vec![b"10.000000:1".to_vec()]);
    // A count that is no count is refused, naming the output.
    classes.outputs[0].parameters.insert(
        "classification".into(),
        InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::StringParam("two".into())) },
    );
    let e = client.model_infer(classes).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("output `output`"), "{}", e.message());

    // Statistics: every phase counted per served request, version "1".
    let stats = client
        .model_statistics(ModelStatisticsRequest { name: "emu".into(), version: String::new() })
        .await
        .unwrap()
        .into_inner();
    let s = &stats.model_stats[0];
    assert_eq!(s.version, "1");
    let i = s.inference_stats.as_ref().unwrap();
    let counts: Vec<u64> = [&i.success, &i.compute_input, &i.compute_infer, &i.compute_output]
        .iter()
        .map(|d| d.as_ref().unwrap().count)
        .collect();
    assert_eq!(counts, vec![3, 3, 3, 3], "{s:?}");
    let again = client
        .model_statistics(ModelStatisticsRequest { name: "emu".into(), version: "1".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.model_stats[0].inference_count, 3, "version 1 is the app's statistics");
    server.stop().await.unwrap();
}
