"""OIP conformance: the official tritonclient (HTTP) talks to a running sluice.

Usage: oip_client.py HOST:PORT APP INPUT_NAME
Checks liveness, readiness, model readiness and metadata, runs an inference with
JSON tensors, then with the client's defaults (binary tensors both ways), and prints
one JSON line with what it saw.
"""
import json
import sys

import numpy as np
import tritonclient.http as httpclient


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
    default_named = client.infer(app, [inp], outputs=[httpclient.InferRequestedOutput("output")]).as_numpy("output")
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
    print(json.dumps({
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
