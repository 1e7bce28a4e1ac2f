"""A plain Triton Python model: y = x + 1 (FP32 [n, 4])."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", (x + 1).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
