"""The gateway routes a meta model only to workers that serve its whole group.

Fake workers (real gRPC on loopback); ``cascade`` is a meta (backend ``hloserve_meta`` with
``hloserve.meta_calls``) calling ``fast`` and ``strong``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("tritonclient.grpc")

from test_gateway_proxy import FakeWorker, fleet, run

from hloserve.model_repository_tools import names


@dataclass
class MetaWorker(FakeWorker):
    """A fake worker whose ``cascade`` is a meta calling ``fast`` and ``strong``."""

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        response = await super().ModelConfig(request, context)
        if request.name == "cascade":
            response.config.backend = names.META_BACKEND
            response.config.max_batch_size = 0
            response.config.parameters[names.PARAM_META_CALLS].string_value = "fast,strong"
        return response


def test_meta_is_routed_only_to_workers_with_its_whole_group() -> None:
    async def body() -> None:
        async with fleet(
            MetaWorker("w0", ("cascade", "fast")),  # lacks strong
            MetaWorker("w1", ("cascade", "fast", "strong")),
            MetaWorker("w2", ("cascade", "fast", "strong")),
        ) as f:
            table = f.router.table
            _, w1, w2 = table.get("fast").replicas  # plain models keep every replica
            assert table.get("cascade").replicas == (w1, w2)
            assert table.get("cascade").max_batch is None

    run(body)


def test_meta_without_a_whole_group_anywhere_keeps_its_replicas() -> None:
    async def body() -> None:
        async with fleet(MetaWorker("w0", ("cascade", "fast"))) as f:
            assert len(f.router.table.get("cascade").replicas) == 1

    run(body)
