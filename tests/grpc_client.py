"""KServe v2 gRPC conformance: the official tritonclient (gRPC), unchanged, talks to
a running sluice.

Usage: grpc_client.py HOST:PORT APP INPUT_NAME SLOW_APP CALLS
Checks liveness, readiness, metadata, the model configuration, repository index and
statistics extensions, runs inferences with the client's defaults (raw tensor
bytes), a batch of three samples, an unknown model and a bad shape, then fires
CALLS inferences at SLOW_APP at once (async_infer) to overload it; then asks for
classes (class_count), sends compressed requests and calls what sluice refuses
(streaming, shared memory, load/unload, trace and log settings). Prints one JSON
line with what it saw.
"""
import json
import sys
import threading

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def error_of(call):
    try:
        call()
    except InferenceServerException as e:
        return {"status": e.status(), "message": e.message()}
    return None


def main():
    url, app, input_name, slow, calls = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    client = grpcclient.InferenceServerClient(url=url)
    assert client.is_server_live(), "server not live"
    assert client.is_server_ready(), "server not ready"
    assert client.is_model_ready(app), "model not ready"
    meta = client.get_model_metadata(app, as_json=True)
    config = client.get_model_config(app, as_json=True)["config"]
    index = client.get_model_repository_index(as_json=True).get("models", [])
    server = client.get_server_metadata(as_json=True)

    # One sample, the client's defaults: raw_input_contents in, raw out.
    data = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    inp = grpcclient.InferInput(input_name, list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer(app, [inp], request_id="grpc-1")
    one = result.as_numpy("output")
    response = result.get_response(as_json=True)

    # A batch of three samples: three queued requests, one answer in order.
    batch = np.array([[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]], dtype=np.float32)
    inp = grpcclient.InferInput(input_name, list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch)
    batched = client.infer(app, [inp], outputs=[grpcclient.InferRequestedOutput("output")])
    rows = batched.as_numpy("output")

    unknown = error_of(lambda: client.infer("no-such-app", [inp]))
    bad = np.ones((1, 5), dtype=np.float32)
    bad_inp = grpcclient.InferInput(input_name, list(bad.shape), "FP32")
    bad_inp.set_data_from_numpy(bad)
    bad_shape = error_of(lambda: client.infer(app, [bad_inp]))
    unknown_meta = error_of(lambda: client.get_model_metadata("no-such-app"))

    # Overload: CALLS requests at once; each gets exactly one answer.
    answers = {}
    lock = threading.Lock()
    done = threading.Event()

    def callback(i, result, error):
        with lock:
            answers.setdefault(i, []).append("OK" if error is None else error.status())
            if len(answers) == calls:
                done.set()

    one_sample = grpcclient.InferInput(input_name, [1, 4], "FP32")
    one_sample.set_data_from_numpy(data)
    for i in range(calls):
        client.async_infer(slow, [one_sample], callback=lambda result, error, i=i: callback(i, result, error), request_id=str(i))
    assert done.wait(60), f"only {len(answers)} of {calls} calls answered"
    codes = {}
    for i, got in answers.items():
        assert len(got) == 1, (i, got)
        codes[got[0]] = codes.get(got[0], 0) + 1
    stats = client.get_inference_statistics(app, as_json=True)["model_stats"][0]

    # The classification extension: class_count on a requested output (raw BYTES).
    top = client.infer(app, [one_sample], outputs=[grpcclient.InferRequestedOutput("output", class_count=2)])
    # Compressed requests, as the client offers them; no id sent, none answered.
    compressed = {}
    for algorithm in ("gzip", "deflate"):
        got = client.infer(app, [one_sample], compression_algorithm=algorithm)
        compressed[algorithm] = got.as_numpy("output").tolist()
    no_id = got.get_response(as_json=True).get("id", "absent")
    # What sluice does not serve is refused with a message, never taken for a
    # success (Triton's C++ client reads an empty message as one).
    stream_errors = []
    client.start_stream(callback=lambda result, error: stream_errors.append(str(error)))
    try:
        client.async_stream_infer(app, [one_sample])
    except InferenceServerException as e:
        # The stream already ended with the server's refusal (given to the callback).
        stream_errors.append(e.message())
    client.stop_stream()
    refused = {
        "shm_register": error_of(lambda: client.register_system_shared_memory("r", "/sluice-test", 64)),
        "shm_status": error_of(lambda: client.get_system_shared_memory_status()),
        "cuda_unregister": error_of(lambda: client.unregister_cuda_shared_memory()),
        "load": error_of(lambda: client.load_model(app)),
        "unload": error_of(lambda: client.unload_model(app)),
        "trace": error_of(lambda: client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})),
        "log": error_of(lambda: client.get_log_settings()),
    }
    print(json.dumps({
        "top": [v.decode() for v in top.as_numpy("output").reshape(-1)],
        "top_shape": list(top.as_numpy("output").shape),
        "compressed": compressed,
        "no_id": no_id,
        "stream_errors": stream_errors,
        "refused": refused,
        "meta": meta,
        "config": config,
        "index": index,
        "extensions": server.get("extensions", []),
        "one": one.tolist(),
        "model_name": response["model_name"],
        "model_version": response["model_version"],
        "id": response.get("id"),
        "rows": rows.tolist(),
        "unknown": unknown,
        "bad_shape": bad_shape,
        "unknown_meta": unknown_meta,
        "codes": codes,
        "stats": stats,
    }))


if __name__ == "__main__":
    main()
