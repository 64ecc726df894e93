"""Ray Serve deployment for the peers benchmark (BENCHMARKS.md §8).

Usage: python ray_serve.py --model PATH --port PORT [--replicas 2] [--max-batch 4]
       [--batch-wait-s 0.01]

`replicas` replicas of one ONNX model on ONNX Runtime's CPU provider with one
intra-op thread; `@serve.batch` gathers up to `max_batch` requests (waiting at most
`batch_wait_s` for the batch to fill) into one `session.run`. It answers Open
Inference Protocol JSON on `POST /v2/models/<name>/infer`, as sluice and MLServer
do, so one load generator drives all three with the same body. Prints
"ray serve ready on http://127.0.0.1:PORT" when the application is running, then
serves until SIGTERM or SIGINT, on which it shuts Ray down (no stray raylets).
"""

import argparse
import os
import signal
import sys
import time

import numpy as np
import onnxruntime as ort
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse


def deployment(replicas: int, max_batch: int, batch_wait_s: float):
    # One CPU per replica: with `ray.init(num_cpus=replicas)` Ray places exactly
    # `replicas` of them, as sluice runs `workers` workers. `max_ongoing_requests`
    # at twice the batch lets a replica hold a full batch while another forms
    # (Ray's docs: it must be at least `max_batch_size` for batches to fill).
    @serve.deployment(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": 1},
        max_ongoing_requests=2 * max_batch,
    )
    class OnnxModel:
        def __init__(self, path: str):
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            self.input = self.session.get_inputs()[0].name
            self.output = self.session.get_outputs()[0].name
            self.name = os.path.splitext(os.path.basename(path))[0]

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=batch_wait_s)
        async def infer(self, samples: list) -> list:
            (y,) = self.session.run([self.output], {self.input: np.stack(samples)})
            return list(y)

        async def __call__(self, request: Request):
            body = await request.json()
            tensor = body["inputs"][0]
            shape = tensor["shape"]
            if tensor.get("datatype") != "FP32" or len(shape) != 4 or shape[0] != 1:
                return JSONResponse({"error": "expected one FP32 sample of shape [1, C, H, W]"}, status_code=400)
            x = np.asarray(tensor["data"], dtype=np.float32).reshape(shape[1:])
            y = await self.infer(x)
            return {
                "model_name": self.name,
                "outputs": [
                    {"name": self.output, "datatype": "FP32", "shape": [1, *y.shape], "data": y.ravel().tolist()}
                ],
            }

    return OnnxModel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--batch-wait-s", type=float, default=0.01)
    a = p.parse_args()
    name = os.path.splitext(os.path.basename(a.model))[0]
    ray.init(
        num_cpus=a.replicas,
        include_dashboard=False,
        object_store_memory=256 * 1024 * 1024,
        logging_level="warning",
        log_to_driver=False,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": a.port}, logging_config={"log_level": "WARNING"})
    app = deployment(a.replicas, a.max_batch, a.batch_wait_s).bind(os.path.abspath(a.model))
    serve.run(app, name=name, route_prefix=f"/v2/models/{name}/infer")

    def stop(*_):
        serve.shutdown()
        ray.shutdown()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"ray serve ready on http://127.0.0.1:{a.port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
