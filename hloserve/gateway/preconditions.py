"""``lpt_packing``'s precondition on its workers: they schedule ``fifo`` or ``edf``, not ``fair``.

``lpt_packing`` places models on workers from their measured load assuming each worker runs
requests in arrival (``fifo``) or deadline (``edf``) order; a ``fair`` worker reorders them by
weight and recent compute (docs/scheduling.md, "The gateway's lpt_packing"). A worker's
discipline is the ``hloserve.scheduling`` parameter of its ``hloserve_runtime`` model, read
with KServe's ``ModelConfig`` (absent = ``fair``). A worker that does not answer, or serves no
hloserve runtime, is reported and not held against the gateway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import grpc

from hloserve.errors import InvalidArgumentError, WorkerSchedulingError
from hloserve.gateway.upstreams import Upstreams
from hloserve.model_parameters import RuntimeParameters, string_values
from hloserve.names import PARAM_SCHEDULING, RUNTIME_BACKEND, RUNTIME_MODEL

log = logging.getLogger("hloserve.gateway")

_NO_RUNTIME = "gateway: worker %s serves no hloserve runtime; its scheduling is unknown"
#: The disciplines ``lpt_packing`` accepts on its workers.
LPT_DISCIPLINES = ("fifo", "edf")


async def worker_discipline(upstreams: Upstreams, worker: str, timeout_s: float) -> str | None:
    """``worker``'s scheduling discipline, or None when it serves no hloserve runtime or does
    not answer (the reason is logged)."""
    try:
        config = await upstreams.model_config(worker, RUNTIME_MODEL, timeout_s)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            log.warning(_NO_RUNTIME, worker)
            return None
        log.warning(
            "gateway: worker %s: cannot read %s's config (%s); its scheduling is unknown",
            worker,
            RUNTIME_MODEL,
            exc.code().name,
        )
        return None
    if config.backend != RUNTIME_BACKEND:
        log.warning(
            "gateway: worker %s serves no hloserve runtime; its scheduling is unknown", worker
        )
        return None
    params = string_values(config.parameters)
    try:
        return str(RuntimeParameters.read(RUNTIME_MODEL, params, PARAM_SCHEDULING))
    except InvalidArgumentError as exc:  # its runtime refuses it too; lpt_packing names it
        log.warning("gateway: worker %s: %s", worker, exc.message)
        return params[PARAM_SCHEDULING]


def check_lpt_disciplines(disciplines: Mapping[str, str | None]) -> None:
    """Refuse workers whose discipline ``lpt_packing`` cannot plan for.

    Args:
        disciplines: worker -> its discipline (None = unknown: accepted).

    Raises:
        WorkerSchedulingError: (FAILED_PRECONDITION) naming every worker that schedules
            anything but ``fifo`` or ``edf``, and how to change it.
    """
    wrong = {w: d for w, d in disciplines.items() if d is not None and d not in LPT_DISCIPLINES}
    if wrong:
        listed = ", ".join(f"{w} ({d})" for w, d in sorted(wrong.items()))
        raise WorkerSchedulingError(
            f"gateway mode lpt_packing needs workers that schedule fifo or edf; {listed} "
            "schedule otherwise: rebuild their repositories with hloserve repo build "
            "--scheduling fifo (or edf), or serve them with hloserve serve --scheduling fifo "
            "(docs/scheduling.md)"
        )


async def check_lpt_workers(upstreams: Upstreams, timeout_s: float) -> None:
    """Read every worker's discipline and apply :func:`check_lpt_disciplines`.

    Raises:
        WorkerSchedulingError: see :func:`check_lpt_disciplines`.
    """
    found = await asyncio.gather(
        *(worker_discipline(upstreams, w, timeout_s) for w in upstreams.workers)
    )
    check_lpt_disciplines(dict(zip(upstreams.workers, found, strict=True)))
