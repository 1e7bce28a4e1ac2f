"""Triton backend ``hloserve_runtime``: a ``pb_utils`` shim over ``RuntimeModel`` and
``RuntimeServer``, one instance per device, the only JAX process; it serves fronts over the
channel, not inference requests, and owns the device memory (allocator set before JAX starts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import triton_python_backend_utils as pb_utils

from hloserve.errors import UnimplementedError
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend import channel
from hloserve.triton_backend.backends import pb
from hloserve.triton_backend.backends.metrics import (
    TritonCacheMetrics,
    TritonRuntimeMetrics,
    foreign_bytes_from_args,
)
from hloserve.triton_backend.runtime.config import allocator_from_args, device_memory_from_args
from hloserve.triton_backend.runtime.core import RuntimeModel
from hloserve.triton_backend.runtime.scheduler import SchedulerConfig
from hloserve.triton_backend.runtime.server import RuntimeServer


class TritonPythonModel:
    """The runtime: loads the bundles its fronts ask for and runs one execution at a time."""

    def initialize(self, args: dict[str, str]) -> None:
        pb.configure_logging()
        self.metrics: TritonCacheMetrics | None = None
        model_args = ModelArgs.from_triton(args)
        allocator_from_args(model_args)  # before JAX opens the device (from_args below)
        foreign = foreign_bytes_from_args(model_args)

        def metrics(budget: int | None, models: Sequence[str]) -> TritonCacheMetrics:
            self.metrics = TritonCacheMetrics(pb_utils, budget, models, foreign)
            return self.metrics

        self.state = TritonRuntimeMetrics(pb_utils)
        self.core = RuntimeModel.from_args(
            model_args,
            observer=metrics,
            on_load=lambda key: self.metrics.announce(key) if self.metrics else None,
            executables=self.state.counted,
        )
        self.server = RuntimeServer(
            self.core,
            address=channel.address(model_args.name),
            scheduler_config=SchedulerConfig.from_parameters(
                model_args.parameters, model=model_args.name
            ),
            publish=self.state.executed,
            publish_state=self.state.publish,
            memory=device_memory_from_args(model_args, self.core.device, self.core.store),
        )
        self.server.start()

    def execute(self, requests: list[Any]) -> list[Any]:
        error = UnimplementedError(
            "hloserve_runtime serves front models over its channel; send inference requests "
            "to the models themselves"
        )
        return [pb.inference_response(pb_utils, error) for _ in requests]

    def finalize(self) -> None:
        self.server.close()
        self.core.close()
        self.state.close()
        if self.metrics is not None:
            self.metrics.close()
