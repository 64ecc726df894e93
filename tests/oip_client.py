"""OIP conformance: the official tritonclient (HTTP) talks to a running sluice.

Usage: oip_client.py HOST:PORT APP INPUT_NAME
Checks liveness, readiness, model readiness and metadata, runs an inference with
JSON tensors, then with the client's defaults (binary tensors both ways), reads the
extensions (configuration, index, statistics), asks for classes (class_count),
sends and accepts compressed bodies, calls what sluice refuses (shared memory,
load, trace and log settings), and prints one JSON line with what it saw.
"""
import json
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def error_of(call):
    try:
        call()
    except InferenceServerException as e:
        return {"status": e.status(), "message": e.message()}
    return None


def main():
    url, app, input_name = sys.argv[1], sys.argv[2], sys.argv[3]
    client = httpclient.InferenceServerClient(url=url)
    assert client.is_server_live(), "server not live"
    assert client.is_server_ready(), "server not ready"
    assert client.is_model_ready(app), "model not ready"
    meta = client.get_model_metadata(app)
    assert meta["name"] == app, meta
    assert meta["inputs"][0]["name"] == input_name, meta
    data = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    inp = httpclient.InferInput(input_name, list(data.shape), "FP32")
    inp.set_data_from_numpy(data, binary_data=False)
    out = httpclient.InferRequestedOutput("output", binary_data=False)
    result = client.infer(app, [inp], outputs=[out], request_id="oip-1")
    arr = result.as_numpy("output")
    response = result.get_response()
    # The client's defaults: binary input data, and binary outputs (no outputs
    # named: the client sets binary_data_output; a named output: binary_data=True).
    inp = httpclient.InferInput(input_name, list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    default_none = client.infer(app, [inp], request_id="oip-2").as_numpy("output")
    named = client.infer(app, [inp], outputs=[httpclient.InferRequestedOutput("output")])
    default_named = named.as_numpy("output")
    default_named_response_id = named.get_response().get("id", "absent")
    assert default_none.dtype == np.float32 and default_named.dtype == np.float32
    assert np.array_equal(default_none, arr) and np.array_equal(default_named, arr), (default_none, arr)
    # A batch of three samples (the metadata's -1): one row per sample, in order.
    batch = np.array([[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]], dtype=np.float32)
    inp = httpclient.InferInput(input_name, list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch)
    rows = client.infer(app, [inp]).as_numpy("output")
    # The extensions: a variant's readiness and metadata, the model configuration,
    # the repository index, statistics.
    version = meta["versions"][0]
    assert client.is_model_ready(app, version), "variant not ready"
    assert client.get_model_metadata(app, version)["versions"] == [version]
    config = client.get_model_config(app)
    index = client.get_model_repository_index()
    stats = client.get_inference_statistics(app)["model_stats"][0]
    # The classification extension: class_count on a requested output, in binary
    # (the client's default) and in JSON.
    inp = httpclient.InferInput(input_name, list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    top = client.infer(app, [inp], outputs=[httpclient.InferRequestedOutput("output", class_count=1)])
    top_json = client.infer(
        app, [inp], outputs=[httpclient.InferRequestedOutput("output", binary_data=False, class_count=5)]
    )
    # Compression both ways, as the client offers it.
    compressed = {}
    for algorithm in ("gzip", "deflate"):
        got = client.infer(
            app,
            [inp],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        ).as_numpy("output")
        compressed[algorithm] = got.tolist()
    # What sluice does not serve is refused, never taken for a success.
    refused = {
        "shm_register": error_of(lambda: client.register_system_shared_memory("r", "/sluice-test", 64)),
        "shm_status": error_of(lambda: client.get_system_shared_memory_status()),
        "cuda_unregister": error_of(lambda: client.unregister_cuda_shared_memory()),
        "load": error_of(lambda: client.load_model(app)),
        "trace": error_of(lambda: client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})),
        "log": error_of(lambda: client.update_log_settings(settings={"log_verbose_level": 1})),
    }
    print(json.dumps({
        "top": [v.decode() for v in top.as_numpy("output").reshape(-1)],
        "top_shape": list(top.as_numpy("output").shape),
        "top_json": [v.decode() if isinstance(v, bytes) else v for v in top_json.as_numpy("output").reshape(-1)],
        "compressed": compressed,
        "refused": refused,
        "no_id": default_named_response_id,
        "rows": rows.tolist(),
        "config": config,
        "index": index,
        "stats": stats,
        "shape": list(arr.shape),
        "sum": float(arr[0, 1]),
        "model_name": response["model_name"],
        "model_version": response["model_version"],
        "id": response.get("id"),
        "versions": meta["versions"],
        "binary_sum": float(default_none[0, 1]),
    }))


if __name__ == "__main__":
    main()
