"""``lpt_packing``'s precondition: every worker schedules ``fifo`` or ``edf``, not ``fair``
(docs/scheduling.md, "The gateway's lpt_packing"); an unknown discipline is logged and accepted.
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
    """``worker``'s scheduling discipline, or None when unknown (the reason is logged)."""
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
        log.warning(_NO_RUNTIME, worker)
        return None
    params = string_values(config.parameters)
    try:
        return str(RuntimeParameters.read(RUNTIME_MODEL, params, PARAM_SCHEDULING))
    except InvalidArgumentError as exc:  # its runtime refuses it too; lpt_packing names it
        log.warning("gateway: worker %s: %s", worker, exc.message)
        return params[PARAM_SCHEDULING]


def check_lpt_disciplines(disciplines: Mapping[str, str | None]) -> None:
    """Refuse workers (-> discipline, None: unknown) whose discipline ``lpt_packing`` cannot plan.

    Raises:
        WorkerSchedulingError: naming every such worker and how to change it.
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
    """Read every worker's discipline and apply :func:`check_lpt_disciplines` (which raises)."""
    found = await asyncio.gather(
        *(worker_discipline(upstreams, w, timeout_s) for w in upstreams.workers)
    )
    check_lpt_disciplines(dict(zip(upstreams.workers, found, strict=True)))
