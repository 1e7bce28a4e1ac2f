"""Triton backend ``hloserve_runtime``: a shim over the typed cores ``RuntimeModel`` and
``RuntimeServer``.

Adapts ``pb_utils`` objects only; the behaviour lives in the typed cores. One instance per
device: the only process of the server that imports JAX. It serves the fronts over the channel
(docs/serving.md, "Front -> runtime (the channel)"), not through inference requests. Weight
cache events and execution counts become metrics on Triton's :8002 endpoint
(hloserve.triton_backend.backends.metrics), and so do executables compiled or loaded from the
executable cache (hloserve.triton_backend.runtime.executable_cache); the foreign models' memory
hints (``hloserve.foreign_memory_bytes``) become ``hloserve_weight_bytes{residency="foreign"}``.
It owns its device memory (hloserve.triton_backend.runtime.device_memory): JAX's allocator is set
before JAX opens the device, and the weight budget is sized from the card on every bundle load.
"""

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
from hloserve.triton_backend.runtime.scheduler_config import scheduler_config_from_args
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
            scheduler_config=scheduler_config_from_args(model_args),
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
