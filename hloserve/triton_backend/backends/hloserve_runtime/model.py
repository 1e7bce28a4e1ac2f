"""Triton backend ``hloserve_runtime``: a shim over the typed core ``RuntimeModel``.

Adapts ``pb_utils`` objects only; the behaviour lives in the typed core. One instance per
device: the only process of the server that imports JAX. Weight cache events become metrics on
Triton's :8002 endpoint (hloserve.triton_backend.metrics), and so do executables compiled or
loaded from the executable cache (hloserve.triton_backend.executable_cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import triton_python_backend_utils as pb_utils

from hloserve.triton_backend import pb
from hloserve.triton_backend.executable_cache import TritonExecutableMetrics
from hloserve.triton_backend.metrics import TritonCacheMetrics, TritonExecutionMetrics
from hloserve.triton_backend.runtime import RuntimeModel


class TritonPythonModel:
    """The runtime: loads bundles on first use and runs one execution at a time."""

    def initialize(self, args: dict[str, str]) -> None:
        pb.configure_logging()
        self.metrics: TritonCacheMetrics | None = None

        def metrics(budget: int | None, models: Sequence[str]) -> TritonCacheMetrics:
            self.metrics = TritonCacheMetrics(pb_utils, budget, models)
            return self.metrics

        self.executions = TritonExecutionMetrics(pb_utils)
        self.executables = TritonExecutableMetrics(pb_utils)
        self.core = RuntimeModel.from_args(
            pb.ModelArgs.from_triton(args),
            observer=metrics,
            on_execute=self.executions.executed,
            executables=self.executables.counted,
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                outputs = self.core.execute(
                    pb.request_inputs(request), request.requested_output_names()
                )
            except Exception as exc:
                responses.append(pb.inference_response(pb_utils, exc, tagged=True))
                continue
            responses.append(pb.inference_response(pb_utils, outputs, tagged=True))
        return responses

    def finalize(self) -> None:
        self.core.close()
        self.executions.close()
        self.executables.close()
        if self.metrics is not None:
            self.metrics.close()
