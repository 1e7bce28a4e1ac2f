"""Triton backend ``hloserve_meta``: a shim over the typed core ``MetaModel``.

Adapts ``pb_utils`` objects only; the behaviour lives in ``hloserve.meta``. ``call`` is BLS to
the sub-model's front model on this tritonserver, with the time left as the request's
``timeout`` and the parameter that makes the front tag its errors with their status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from hloserve.meta import MetaModel
from hloserve.model_repository_tools import names
from hloserve.triton_backend import pb


class TritonPythonModel:
    """One meta instance: runs one request at a time (Triton sends one per execute)."""

    def initialize(self, args: dict[str, str]) -> None:
        pb.configure_logging()
        self.core = MetaModel.from_args(pb.ModelArgs.from_triton(args), self._send)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                outputs = self.core.execute(
                    pb.request_inputs(request), timeout_us=int(request.timeout())
                )
                wanted = request.requested_output_names()
                if wanted:
                    outputs = {n: outputs[n] for n in wanted if n in outputs}
            except Exception as exc:
                responses.append(pb.inference_response(pb_utils, exc))
                continue
            responses.append(pb.inference_response(pb_utils, outputs))
        return responses

    def _send(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        timeout_us: int,
    ) -> dict[str, np.ndarray]:
        request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=list(outputs),
            inputs=[pb.to_triton_tensor(pb_utils, n, np.asarray(a)) for n, a in inputs.items()],
            timeout=timeout_us,
            parameters={names.REQUEST_PARAM_TAG_ERRORS: True},
        )
        response = request.exec()
        if response.has_error():
            raise pb.error_from_triton(pb_utils, response.error())
        # The response owns the memory: copy what outlives it.
        return {t.name(): pb.to_numpy(t).copy() for t in response.output_tensors()}

    def finalize(self) -> None:
        pass
