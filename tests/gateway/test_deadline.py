"""A client's gRPC deadline (``grpc-timeout``; tritonclient's ``client_timeout``) reaches the
worker through the gateway, on HAProxy's path and on the Python checked path (issue 28 item
2). The worker's own answer to an expired request, on a real tritonserver:
``tests/model_repository_tools/test_queue_serve.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc.aio as triton_aio

from tests.gateway.test_proxy import FakeWorker, gateway, run


@dataclass
class DeadlineWorker(FakeWorker):
    """A fake worker that keeps the time each ModelInfer had left (None: no deadline)."""

    left: list[float | None] = field(default_factory=list)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.left.append(context.time_remaining())
        return await super().ModelInfer(request, context)


def test_the_clients_grpc_timeout_reaches_the_worker() -> None:
    async def body() -> None:
        worker = DeadlineWorker("w0")
        async with gateway(worker, upstream={"request_timeout_seconds": 60}) as g:
            fp32 = triton_aio.InferInput("IN", [1, 2], "FP32")  # HAProxy routes it
            fp32.set_data_from_numpy(np.ones((1, 2), np.float32))
            text = triton_aio.InferInput("IN", [1, 1], "BYTES")  # the Python checked path
            text.set_data_from_numpy(np.array([[b"x"]], np.object_))
            for tensor in (fp32, text):
                await g.client.infer("echo", [tensor], client_timeout=3.0)
                left = worker.left[-1]
                assert left is not None and 0 < left <= 3.1, worker.left  # grpc rounds up
                await g.client.infer("echo", [tensor])  # no deadline: none, or the gateway's
                assert worker.left[-1] is None or worker.left[-1] > 30, worker.left

    run(body)
