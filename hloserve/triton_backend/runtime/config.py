"""The runtime's allocator, device memory and weight cache from its config parameters
(docs/serving.md, "Runtime model config"); malformed values are InvalidArgumentError naming
the model and the parameter."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from hloserve import names
from hloserve.errors import InvalidArgumentError
from hloserve.model_parameters import ModelArgs, RuntimeParameters, check_one_budget
from hloserve.triton_backend.runtime.device_memory import (
    MARGIN,
    DeviceMemory,
    allocator_environment,
    memory_stats,
)
from hloserve.triton_backend.runtime.residency import Residency
from hloserve.triton_backend.runtime.weight_cache import CacheObserver, WeightCache

log = logging.getLogger("hloserve.triton_backend.runtime")
#: makes the weight cache's observer from (budget bytes or None, model names)
ObserverFactory = Callable[[int | None, Sequence[str]], CacheObserver]


def weight_cache_from_args(
    args: ModelArgs,
    models: set[str] | None = None,
    *,
    device: Any = None,
    observer: ObserverFactory | None = None,
) -> WeightCache:
    """The runtime's :class:`WeightCache` from its config parameters (docs/on_demand_weights.md,
    "Configure"), budget logged; InvalidArgumentError for a malformed value, bytes and a fraction
    both, or a residency for a model not in ``models`` (when given)."""
    budget = _budget(args, device)
    interval = _read(args, names.PARAM_COMPACTION_INTERVAL)
    listed = dict(_read(args, names.PARAM_RESIDENCY))
    unknown = sorted(set(listed) - models) if models is not None else []
    if unknown:
        raise InvalidArgumentError(
            f"model {args.name!r}: parameter {names.PARAM_RESIDENCY!r} names models {unknown} "
            f"that this runtime does not serve ({sorted(models or ())})"
        )
    residency = {model: Residency(value) for model, value in listed.items()}
    if budget:
        log.info(
            "weight cache: budget %d bytes for all weights (%s), residency %s, compaction %s",
            budget,
            names.PARAM_WEIGHT_CACHE_BYTES,
            names.format_residency(listed) or f"all {names.DEFAULT_RESIDENCY}",
            f"every {interval} loads" if interval else "off",
        )
    else:
        log.info("weight cache: no budget; every model's weights stay on the device")
    return WeightCache(
        budget or None,
        residency=residency,
        compaction_interval=interval,
        observer=observer(budget or None, sorted(models if models is not None else listed))
        if observer
        else None,
    )


def allocator_from_args(args: ModelArgs) -> dict[str, str]:
    """Set JAX's allocator from ``hloserve.device_memory_fraction`` (before JAX opens the
    device) and log it; the variables set."""
    settings = allocator_environment(_read(args, names.PARAM_DEVICE_MEMORY_FRACTION))
    log.info("device memory: %s", " ".join(f"{k}={v}" for k, v in sorted(settings.items())))
    return settings


def device_memory_from_args(args: ModelArgs, device: Any, cache: Any) -> DeviceMemory:
    """The runtime's :class:`DeviceMemory` over its weight cache (budget sized from the card
    unless given)."""
    explicit = bool(
        _read(args, names.PARAM_WEIGHT_CACHE_BYTES)
        or _read(args, names.PARAM_WEIGHT_CACHE_FRACTION)
    )
    fraction = _read(args, names.PARAM_DEVICE_MEMORY_FRACTION)
    return DeviceMemory(device, cache, explicit=explicit, fraction=fraction)


def _budget(args: ModelArgs, device: Any) -> int:
    """Bytes of ``hloserve.weight_cache_bytes``, else ``_fraction`` of ``device``'s free memory,
    else sized from the card (re-sized later by :class:`DeviceMemory`); 0: no budget (CPU)."""
    budget: int = _read(args, names.PARAM_WEIGHT_CACHE_BYTES)
    fraction: float = _read(args, names.PARAM_WEIGHT_CACHE_FRACTION)
    stats = memory_stats(device)
    if not fraction and not budget and stats is not None:
        budget = int(stats["bytes_limit"] * (1 - MARGIN))
        log.info(
            "weight cache: budget sized from the device: %d bytes = bytes_limit %d less the "
            "%g margin, less executables and scratch as bundles load",
            budget,
            stats["bytes_limit"],
            MARGIN,
        )
        return budget
    if not fraction:
        return budget
    check_one_budget(args.name, budget, fraction)
    key, text = names.PARAM_WEIGHT_CACHE_FRACTION, repr(fraction)
    if stats is None:
        log.info("weight cache: %s = %s but %s reports no memory statistics", key, text, device)
        return 0
    limit, used = int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0))
    budget = max(int(fraction * (limit - used)), 1)
    log.info(
        "weight cache: budget %d bytes = %s x (bytes_limit %d - bytes_in_use %d) of %s; "
        "execution scratch is not reserved",
        budget,
        text,
        limit,
        used,
        device,
    )
    return budget


def _read(args: ModelArgs, key: str) -> Any:
    """The typed value of runtime parameter ``key`` (:mod:`hloserve.model_parameters`)."""
    return RuntimeParameters.read(args.name, args.parameters, key)
