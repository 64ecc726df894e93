"""MLServer custom runtime for the peers benchmark (BENCHMARKS.md §8).

One ONNX model on ONNX Runtime's CPU provider with one intra-op thread, as sluice's
onnx executor runs it (`intra_threads = 1`). MLServer's adaptive batching
(`max_batch_size`, `max_batch_time` in model-settings.json) concatenates the
requests' [1, 3, 224, 224] inputs along dimension 0 before `predict` and splits the
answer after it; `parallel_workers` in settings.json runs this class in that many
worker processes. The model file comes from `parameters.uri`, which
`cargo xtask peers` writes as an absolute path.
"""

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            self.settings.parameters.uri, options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name
        self._output = self._session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        (y,) = self._session.run([self._output], {self._input: x})
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(self._output, y)],
        )
