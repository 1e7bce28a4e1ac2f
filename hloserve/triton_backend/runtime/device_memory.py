"""The runtime's device memory: JAX's allocator settings, the weight budget sized from the
card on every bundle taken, sequence state, and the figures published (docs/on_demand_weights.md,
"Device memory"). Nothing changes where the device has no statistics (CPU)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from hloserve import names
from hloserve.errors import InvalidArgumentError, UnavailableError
from hloserve.units import format_size

log = logging.getLogger("hloserve.triton_backend.runtime")

#: share of the allocator's limit kept free beyond executables and scratch (ReactantServer's
#: "wiggle")
MARGIN = 0.1
#: names a JSON file of ``memory_stats()`` figures read instead of the device's (tests only)
FAKE_STATS_ENV = "HLOSERVE_FAKE_MEMORY_STATS"


def allocator_environment(
    fraction: float = 0.0, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Set JAX's GPU allocator (before JAX opens the device): no preallocation, memory
    ``fraction`` (0: the default 0.9) as ``XLA_CLIENT_MEM_FRACTION``, the older variable removed
    (docs/on_demand_weights.md, "Device memory"). The variables set."""
    env = os.environ if environ is None else environ
    value = fraction or names.DEFAULT_DEVICE_MEMORY_FRACTION
    settings = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_CLIENT_MEM_FRACTION": repr(value)}
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    env.update(settings)
    return settings


def memory_stats(device: Any) -> dict[str, int] | None:
    """``device.memory_stats()`` when it reports ``bytes_limit`` (a GPU), else None (CPU); the
    JSON file named by :data:`FAKE_STATS_ENV` instead when set."""
    fake = os.environ.get(FAKE_STATS_ENV)
    if fake:
        stats: Any = json.loads(Path(fake).read_text())
    else:
        try:
            stats = device.memory_stats() if device is not None else None
        except (AttributeError, RuntimeError):
            stats = None
    if not stats or "bytes_limit" not in stats:
        return None
    return {str(k): int(v) for k, v in stats.items()}


def executable_memory(executable: Any) -> tuple[int, int]:
    """(code bytes, scratch bytes) of a loaded executable from XLA's compiled memory analysis
    (``generated_code_size_in_bytes``, ``temp_size_in_bytes``); (0, 0) where XLA has none."""
    try:
        stats = executable.get_compiled_memory_stats()
    except Exception:  # a backend without the analysis
        return 0, 0
    return int(stats.generated_code_size_in_bytes), int(stats.temp_size_in_bytes)


class DeviceMemory:
    """The runtime's device memory accounting over its weight ``cache`` (thread-safe);
    ``explicit``: the budget was given, not sized here; ``fraction``: the allocator's (card total
    = limit / fraction)."""

    def __init__(self, device: Any, cache: Any, *, explicit: bool, fraction: float) -> None:
        self.device = device
        self.cache = cache
        self.explicit = explicit
        self.fraction = fraction or names.DEFAULT_DEVICE_MEMORY_FRACTION
        self._lock = threading.Lock()
        #: key -> (code bytes, largest scratch bytes) of its executables
        self._executables: dict[str, tuple[int, int]] = {}
        self._state = 0

    def admit(self, key: str, name: str, executables: Mapping[Any, Any]) -> None:
        """Account ``key``'s executables and re-size the budget (evicting to fit);
        InvalidArgumentError (``key`` not kept, numbers named) when the largest model's weights
        no longer fit."""
        stats = memory_stats(self.device)
        if stats is None or getattr(self.cache, "budget_bytes", None) is None:
            return
        sizes = [executable_memory(getattr(e, "loaded", e)) for e in executables.values()]
        with self._lock:
            new = key not in self._executables  # else another front holds it: it stays
            self._executables[key] = (
                sum(c for c, _ in sizes),
                max((t for _, t in sizes), default=0),
            )
            try:
                self._resize(name, stats["bytes_limit"])
            except InvalidArgumentError:
                if new:
                    del self._executables[key]
                raise

    def reserve_state(self, name: str, nbytes: int) -> None:
        """Count a new sequence's ``nbytes`` of state, re-sizing the budget; UnavailableError
        (nothing counted, numbers named) when it does not fit; never refused on CPU."""
        stats = memory_stats(self.device)
        with self._lock:
            self._state += nbytes
            if stats is None or getattr(self.cache, "budget_bytes", None) is None:
                return
            try:
                self._resize(name, stats["bytes_limit"])
            except InvalidArgumentError as exc:
                self._state -= nbytes
                raise UnavailableError(
                    f"model {name!r}: a new sequence's state ({format_size(nbytes)}) does not "
                    f"fit the device budget; end a sequence or retry later ({exc.message})"
                ) from None

    def release_state(self, nbytes: int) -> None:
        """A sequence's ``nbytes`` of state were dropped: the weight budget gets them back."""
        stats = memory_stats(self.device)
        with self._lock:
            self._state = max(self._state - nbytes, 0)
            if stats is None or getattr(self.cache, "budget_bytes", None) is None:
                return
            with contextlib.suppress(InvalidArgumentError):  # only grows: a bigger budget
                self._resize("", stats["bytes_limit"])

    @property
    def state_bytes(self) -> int:
        """Bytes of live sequences' state counted."""
        return self._state

    def forget(self, key: str) -> None:
        """``key`` was unloaded: its executables no longer count."""
        with self._lock:
            self._executables.pop(key, None)

    def _resize(self, name: str, limit: int) -> None:
        code = sum(c for c, _ in self._executables.values())
        scratch = max((t for _, t in self._executables.values()), default=0)
        margin = int(MARGIN * limit)
        state = self._state
        models = self.cache.stats().models
        largest, heaviest = max(((m.nbytes, n) for n, m in models.items()), default=(0, ""))
        numbers = (
            f"bytes_limit {format_size(limit)} - executables {format_size(code)} - largest "
            f"scratch {format_size(scratch)} - margin {format_size(margin)} ({MARGIN:g})"
        )
        if state:
            numbers += f" - sequence state {format_size(state)}"
        if self.explicit:
            budget = int(self.cache.budget_bytes)
            room = limit - code - scratch - margin - state
            if budget > room:
                raise InvalidArgumentError(
                    f"model {name!r}: the weight cache budget of {format_size(budget)} does not "
                    f"fit the device: {numbers} leaves {format_size(room)}"
                    f" (lower {names.PARAM_WEIGHT_CACHE_BYTES} or raise "
                    f"{names.PARAM_DEVICE_MEMORY_FRACTION})"
                )
            return
        budget = limit - code - scratch - margin - state
        if budget < largest:
            raise InvalidArgumentError(
                f"model {name!r}: the device cannot hold the weights of {heaviest!r} "
                f"({format_size(largest)}) beside the executables and the largest scratch: "
                f"weight budget {format_size(max(budget, 0))} = {numbers}"
            )
        self.cache.resize(budget)
        log.info("weight cache: budget %d bytes = %s", budget, numbers)

    def figures(self) -> dict[str, int] | None:
        """Device memory by kind (:data:`~hloserve.metric_names.DEVICE_MEMORY_KINDS`), bytes;
        None on CPU (docs/on_demand_weights.md, "Device memory", Figures)."""
        stats = memory_stats(self.device)
        if stats is None:
            return None
        limit, in_use = stats["bytes_limit"], stats.get("bytes_in_use", 0)
        with self._lock:
            code = sum(c for c, _ in self._executables.values())
            scratch = max((t for _, t in self._executables.values()), default=0)
        return {
            "total": int(limit / self.fraction),
            "limit": limit,
            "in_use": in_use,
            "peak": stats.get("peak_bytes_in_use", in_use),
            "weights": int(self.cache.resident_bytes),
            "executables": code,
            "scratch": scratch,
            "headroom": limit - in_use,
            "budget": int(self.cache.budget_bytes or 0),
        }
