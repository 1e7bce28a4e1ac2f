"""A Triton Python model without a config.pbtxt: y = 2x (FP32 [n, 4]); its tensors come from
``auto_complete_config``."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", (2 * x).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
