"""The runtime's allocator, device memory, weight cache and executable cache from its config
parameters (docs/serving.md, "Runtime model config", "Executable cache"); malformed values are
InvalidArgumentError naming the model and the parameter."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hloserve import names
from hloserve.errors import InvalidArgumentError
from hloserve.model_parameters import ModelArgs, RuntimeParameters, check_one_budget
from hloserve.triton_backend.runtime.device_memory import (
    MARGIN,
    DeviceMemory,
    allocator_environment,
    memory_stats,
)
from hloserve.triton_backend.runtime.executable_cache import DEFAULT_MAX_BYTES, ExecutableCache
from hloserve.triton_backend.runtime.residency import Residency
from hloserve.triton_backend.runtime.weight_cache import CacheObserver, WeightCache

log = logging.getLogger("hloserve.triton_backend.runtime")
_cache_log = logging.getLogger("hloserve.triton_backend.runtime.executable_cache")
#: makes the weight cache's observer from (budget bytes or None, model names)
ObserverFactory = Callable[[int | None, Sequence[str]], CacheObserver]
#: ``HLOSERVE_EXECUTABLE_CACHE`` (directory or ``off``), ``HLOSERVE_EXECUTABLE_CACHE_BYTES``
ENV_PREFIX = "HLOSERVE_EXECUTABLE_"


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


class ExecutableCacheSettings(BaseModel):
    """The cache's settings: ``cache`` a directory, ``off``, or "" (the default directory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache: str = ""
    cache_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1)


def default_directory(environ: Mapping[str, str] | None = None) -> Path:
    """The XDG user cache directory's ``hloserve/executables`` (``$XDG_CACHE_HOME`` when
    absolute, else ``$HOME/.cache``; freedesktop.org basedir-spec)."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path(environ.get("HOME", "~")) / ".cache"
    return root.expanduser() / "hloserve" / "executables"


def cache_settings(
    parameters: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
    *,
    model: str = names.RUNTIME_MODEL,
) -> ExecutableCacheSettings:
    """The runtime's settings: its ``parameters`` over ``HLOSERVE_EXECUTABLE_*`` over the
    defaults; InvalidArgumentError (naming the parameter or variable) for a variable naming no
    setting or a bound that is not a positive integer."""
    from hloserve.settings import load_settings

    settings = load_settings(
        ExecutableCacheSettings,
        raw_keys=("cache",),  # "off" stays a string (YAML would read it as false)
        prefix=ENV_PREFIX,
        environ=os.environ if environ is None else environ,
        path=None,
        what="executable cache settings",
        error=InvalidArgumentError,
    )
    keys = {
        "cache": names.PARAM_EXECUTABLE_CACHE,
        "cache_bytes": names.PARAM_EXECUTABLE_CACHE_BYTES,
    }
    updates = {k: RuntimeParameters.read(model, parameters, key) for k, key in keys.items()}
    return settings.model_copy(update={k: v for k, v in updates.items() if v})


def executable_cache(
    settings: ExecutableCacheSettings,
    *,
    observer: Callable[[str, str], None] | None = None,
    source: str = "",
) -> ExecutableCache:
    """The cache ``settings`` describe (off: disabled), its directory logged with ``source``
    (where the setting came from); InvalidArgumentError for a relative directory."""
    said = f" (from {source})" if source else ""
    if settings.cache.strip().lower() == names.EXECUTABLE_CACHE_OFF:
        _cache_log.info("executable cache: off%s; every executable is compiled", said)
        return ExecutableCache(None, settings.cache_bytes, observer=observer)
    directory = Path(settings.cache).expanduser() if settings.cache else default_directory()
    if not directory.is_absolute():
        raise InvalidArgumentError(
            f"executable cache directory {settings.cache!r}{said} must be an absolute path "
            f"or {names.EXECUTABLE_CACHE_OFF!r}"
        )
    _cache_log.info(
        "executable cache: %s%s, bound %d bytes",
        directory,
        said or " (default)",
        settings.cache_bytes,
    )
    return ExecutableCache(directory, settings.cache_bytes, observer=observer)


def executable_cache_from_args(
    args: ModelArgs, observer: Callable[[str, str], None] | None = None
) -> ExecutableCache:
    """The runtime's cache from its config; InvalidArgumentError naming the runtime model."""
    if _read(args, names.PARAM_EXECUTABLE_CACHE):
        source = f"parameter {names.PARAM_EXECUTABLE_CACHE}"
    else:
        source = f"{ENV_PREFIX}CACHE" if os.environ.get(f"{ENV_PREFIX}CACHE", "").strip() else ""
    named = f"model {args.name!r}: "
    try:
        settings = cache_settings(args.parameters, model=args.name)
        return executable_cache(settings, observer=observer, source=source)
    except InvalidArgumentError as exc:
        if exc.message.startswith(named):  # a parameter's error names the model already
            raise
        raise InvalidArgumentError(named + exc.message) from None
