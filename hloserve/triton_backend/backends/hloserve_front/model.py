"""Triton backend ``hloserve_front``: a shim over the typed core ``FrontModel``.

Adapts ``pb_utils`` objects only; the behaviour lives in the typed core.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from hloserve.model_repository_tools import names
from hloserve.triton_backend import pb
from hloserve.triton_backend.front import FrontModel


def _tags_errors(request: Any) -> bool:
    """Whether the request (a meta model's BLS sub-request) asks for status-tagged errors."""
    try:
        params = json.loads(request.parameters() or "{}")
    except (TypeError, ValueError):
        return False
    return bool(params.get(names.REQUEST_PARAM_TAG_ERRORS))


class TritonPythonModel:
    """One front instance: coalesces requests and calls the runtime model over BLS."""

    def initialize(self, args: dict[str, str]) -> None:
        pb.configure_logging()
        self.core = FrontModel.from_args(pb.ModelArgs.from_triton(args), self._call_runtime)

    def execute(self, requests: list[Any]) -> list[Any]:
        inputs: list[Mapping[str, np.ndarray] | Exception] = []
        for request in requests:
            try:
                inputs.append(pb.request_inputs(request))
            except Exception as exc:  # an unreadable tensor fails this request only
                inputs.append(exc)
        results = self.core.execute(inputs)
        return [
            pb.inference_response(pb_utils, r, tagged=_tags_errors(q))
            for r, q in zip(results, requests, strict=True)
        ]

    def _call_runtime(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        request = pb_utils.InferenceRequest(
            model_name=self.core.runtime_model,
            requested_output_names=list(outputs),
            inputs=[pb.to_triton_tensor(pb_utils, n, a) for n, a in inputs.items()],
        )
        response = request.exec()
        if response.has_error():
            raise pb.error_from_triton(pb_utils, response.error())
        # The response owns the memory: copy what the request's answer keeps.
        return {t.name(): pb.to_numpy(t).copy() for t in response.output_tensors()}

    def finalize(self) -> None:
        pass
