"""The runtime's weight store: an LRU device weight cache under a byte budget (none: every model
resident from its load on); tiers and policy: docs/on_demand_weights.md. Device copies go
through :class:`Transfer`, so the policy is tested without JAX."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from hloserve.bundle.safetensors_file import mmap_tensors
from hloserve.errors import (
    HloserveError,
    InvalidArgumentError,
    NotFoundError,
    Status,
    UnavailableError,
)
from hloserve.triton_backend.runtime.residency import Residency
from hloserve.triton_backend.runtime.transfer import JaxTransfer
from hloserve.units import format_size

if TYPE_CHECKING:  # the policy imports only numpy and hloserve.errors (benchmarks need no more)
    from hloserve.bundle.bundle import Bundle

log = logging.getLogger("hloserve.triton_backend.runtime.weight_cache")


class WeightSource(Protocol):
    """A model's weights on disk."""

    @property
    def nbytes(self) -> int:
        """Total bytes of the weights."""

    def read(self) -> list[np.ndarray]:
        """The weights in argument order; may be memory-mapped views of the file."""


class Transfer(Protocol):
    """Moves weights between host and device (the cache's only device-facing code)."""

    def to_host(self, arrays: Sequence[np.ndarray], device: Any) -> list[Any]:
        """Materialize ``arrays`` in the host tier for ``device`` (a copy, not a view)."""

    def to_device(self, arrays: Sequence[Any], device: Any) -> list[Any]:
        """Copy host arrays to ``device``; returns when the copies are complete."""

    def delete(self, arrays: Sequence[Any]) -> None:
        """Free device arrays now."""


class CacheObserver(Protocol):
    """Receives cache events (the runtime shim turns them into Triton metrics)."""

    def registered(self, name: str, nbytes: int, residency: str) -> None:
        """``name`` (``nbytes`` of weights, ``residency``) was added to the cache."""

    def loaded(self, name: str, nbytes: int, seconds: float, resident_bytes: int) -> None:
        """``name``'s weights became resident; ``resident_bytes`` is the new total."""

    def evicted(self, name: str, nbytes: int, resident_bytes: int) -> None:
        """``name``'s weights left the device; ``resident_bytes`` is the new total."""

    def removed(self, name: str, resident_bytes: int) -> None:
        """``name`` left the cache (its model was unloaded); ``resident_bytes`` is the new
        total."""

    def resized(self, budget_bytes: int) -> None:
        """The budget became ``budget_bytes`` (:meth:`WeightCache.resize`)."""


@dataclass(frozen=True)
class ModelStats:
    """One model's cache state and counters (``load_seconds``: total seconds of its loads)."""

    residency: Residency
    nbytes: int
    resident: bool
    in_use: int
    loads: int
    evictions: int
    load_seconds: float


@dataclass(frozen=True)
class CacheStats:
    """The whole cache: budget (None: unlimited), resident, pinned bytes, per-model stats."""

    budget_bytes: int | None
    resident_bytes: int
    pinned_bytes: int
    compactions: int
    models: Mapping[str, ModelStats]

    @property
    def loads(self) -> int:
        """Host-to-device loads, all models."""
        return sum(m.loads for m in self.models.values())

    @property
    def evictions(self) -> int:
        """Evictions, all models (compaction included)."""
        return sum(m.evictions for m in self.models.values())


@dataclass
class _Model:
    name: str
    residency: Residency
    source: WeightSource
    device: Any
    nbytes: int
    pinned: bool
    host: list[Any] | None = None
    resident: list[Any] | None = None
    in_use: int = 0
    loads: int = 0
    evictions: int = 0
    load_seconds: float = 0.0


class WeightCache:
    """Byte-budgeted LRU cache of device weights, by bundle key (thread-safe).
    ``budget_bytes`` None or 0: every model loaded at add and kept; ``compaction_interval`` N >
    0: free every on-demand buffer after each N on-demand loads; an acquire waits up to
    ``wait_s`` for in-use weights to make room, then UNAVAILABLE."""

    def __init__(
        self,
        budget_bytes: int | None = None,
        *,
        residency: Mapping[str, Residency] | None = None,
        default_residency: Residency = Residency.SYSTEM,
        transfer: Transfer | None = None,
        compaction_interval: int = 0,
        observer: CacheObserver | None = None,
        wait_s: float = 30.0,
    ) -> None:
        if budget_bytes is not None and budget_bytes < 0:
            raise InvalidArgumentError(f"weight cache budget must be >= 0 bytes, {budget_bytes}")
        if compaction_interval < 0:
            raise InvalidArgumentError(f"compaction interval must be >= 0, {compaction_interval}")
        self.budget_bytes = budget_bytes or None
        self._residency = dict(residency or {})
        self._default = default_residency
        self._transfer: Transfer = transfer if transfer is not None else JaxTransfer()
        self._interval = compaction_interval
        self._observer = observer
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self._models: dict[str, _Model] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()  # resident on-demand, oldest first
        self._compactions = 0
        self._loads_since_compaction = 0

    def add(self, name: str, bundle: Bundle, device: Any) -> None:
        """Register ``bundle``'s weights (see :meth:`add_weights`)."""
        self.add_weights(name, BundleWeights(bundle), device)

    def add_weights(self, name: str, source: WeightSource, device: Any) -> None:
        """Register ``source`` under ``name`` (host tier for ``system``, device for ``device``);
        HloserveError INTERNAL if registered, INVALID_ARGUMENT if it exceeds what pinned models
        leave."""
        residency = self._residency.get(name, self._default)
        pinned = self.pinned(name)
        model = _Model(name, residency, source, device, int(source.nbytes), pinned)
        with self._lock:
            self._check_new(model)
        if residency is Residency.SYSTEM and not pinned:
            model.host = self._transfer.to_host(source.read(), device)
        with self._lock:
            self._check_new(model)
            self._models[name] = model
            if self._observer is not None:
                self._observer.registered(name, model.nbytes, residency.value)
            if pinned:
                try:
                    self._make_room(model)
                    self._load(model)
                except BaseException:
                    del self._models[name]
                    raise
        log.info(
            "weights of %r: %d bytes, residency %s%s",
            name,
            model.nbytes,
            residency.value,
            ", loaded (pinned)" if pinned and self.budget_bytes else "",
        )

    def acquire(self, name: str) -> Sequence[Any]:
        """``name``'s device arrays, loaded first if needed (evicting LRU models not in use);
        NotFoundError for an unknown model, UnavailableError when no room frees in time."""
        deadline = time.monotonic() + self._wait_s
        with self._lock:
            model = self._models.get(name)
            if model is None:
                raise NotFoundError(f"weights of model {name!r} are not registered")
            if model.resident is None:
                self._check_fits(model)
                self._maybe_compact()
                self._make_room(model, deadline)
                if self._models.get(name) is not model:  # removed while we waited
                    raise NotFoundError(f"weights of model {name!r} were removed")
                if model.resident is None:  # another thread may have loaded it meanwhile
                    self._load(model)
            if not model.pinned:
                self._lru.move_to_end(name)
            model.in_use += 1
            assert model.resident is not None
            return model.resident

    def release(self, name: str) -> None:
        """End one :meth:`acquire` of ``name``."""
        with self._lock:
            model = self._models.get(name)
            if model is not None and model.in_use > 0:
                model.in_use -= 1
                self._released.notify_all()

    def remove(self, name: str) -> None:
        with self._lock:
            model = self._models.pop(name, None)
            if model is None:
                return
            self._lru.pop(name, None)
            if model.resident is not None:
                arrays, model.resident = model.resident, None
                if model.in_use == 0:  # else an execution holds them: freed when it drops them
                    self._transfer.delete(arrays)
            model.host = None
            self._released.notify_all()
            if self._observer is not None:
                self._observer.removed(name, self._resident_bytes())

    @property
    def resident_bytes(self) -> int:
        with self._lock:
            return self._resident_bytes()

    def pinned(self, name: str) -> bool:
        """Whether ``name`` is (or will be) kept on the device: residency ``device``, no budget."""
        residency = self._residency.get(name, self._default)
        return residency is Residency.DEVICE or self.budget_bytes is None

    def resize(self, budget_bytes: int) -> None:
        """Set the budget, evicting LRU models not in use until the resident weights fit;
        InvalidArgumentError (budget unchanged) without a budget or when pinned weights exceed
        the new one."""
        with self._lock:
            if self.budget_bytes is None:
                raise InvalidArgumentError("a weight cache without a budget cannot be re-sized")
            pinned = self._pinned_bytes()
            if pinned > budget_bytes:
                raise InvalidArgumentError(
                    f"the pinned (residency=device) weights take {format_size(pinned)}, more "
                    f"than the weight cache budget of {format_size(budget_bytes)}"
                )
            self.budget_bytes = budget_bytes
            for name in list(self._lru):
                if self._resident_bytes() <= budget_bytes:
                    break
                if self._models[name].in_use == 0:
                    self._evict(self._models[name])
            if self._observer is not None:
                self._observer.resized(budget_bytes)

    def compact(self) -> int:
        """Free every resident on-demand model not in use; the bytes freed."""
        with self._lock:
            return self._compact()

    def stats(self) -> CacheStats:
        """A consistent snapshot of the cache."""
        with self._lock:
            models = {
                m.name: ModelStats(
                    m.residency,
                    m.nbytes,
                    m.resident is not None,
                    m.in_use,
                    m.loads,
                    m.evictions,
                    m.load_seconds,
                )
                for m in self._models.values()
            }
            return CacheStats(
                self.budget_bytes,
                self._resident_bytes(),
                self._pinned_bytes(),
                self._compactions,
                models,
            )

    def lru_order(self) -> list[str]:
        """Resident on-demand models, least recently used first (the eviction order)."""
        with self._lock:
            return list(self._lru)

    def _resident_bytes(self) -> int:
        return sum(m.nbytes for m in self._models.values() if m.resident is not None)

    def _pinned_bytes(self) -> int:
        return sum(m.nbytes for m in self._models.values() if m.pinned)

    def _check_new(self, model: _Model) -> None:
        if model.name in self._models:
            raise HloserveError(
                f"weights of model {model.name!r} are already registered", status=Status.INTERNAL
            )
        self._check_fits(model)

    def _check_fits(self, model: _Model) -> None:
        """Refuse a model that can never fit: its weights exceed what pinned ones leave."""
        if self.budget_bytes is None:
            return
        others = sum(m.nbytes for m in self._models.values() if m.pinned and m is not model)
        room = self.budget_bytes - others
        if model.nbytes > room:
            pinned = (
                f"; {format_size(others)} of it pinned by residency=device models" if others else ""
            )
            raise InvalidArgumentError(
                f"weights of model {model.name!r} are {format_size(model.nbytes)}, more than the "
                f"weight cache budget of {format_size(self.budget_bytes)}{pinned} "
                f"(raise hloserve.weight_cache_bytes or serve it elsewhere)"
            )

    def _make_room(self, model: _Model, deadline: float | None = None) -> None:
        """Evict LRU models until ``model`` fits; wait for releases if only in-use ones could."""
        if self.budget_bytes is None:
            return
        while model.resident is None:
            over = self._resident_bytes() + model.nbytes - self.budget_bytes
            if over <= 0:
                return
            victim = next((n for n in self._lru if self._models[n].in_use == 0), None)
            if victim is not None:
                self._evict(self._models[victim])
                continue
            left = (deadline or time.monotonic()) - time.monotonic()
            if left <= 0 or not self._released.wait(timeout=left):
                in_use = sorted(n for n in self._lru if self._models[n].in_use)
                raise UnavailableError(
                    f"weights of model {model.name!r} ({format_size(model.nbytes)}) do not fit: "
                    f"{format_size(over)} more is needed and models {in_use} are executing; retry"
                )

    def _load(self, model: _Model) -> None:
        start = time.perf_counter()
        host = model.host if model.host is not None else model.source.read()
        model.resident = self._transfer.to_device(host, model.device)
        seconds = time.perf_counter() - start
        model.loads += 1
        model.load_seconds += seconds
        if not model.pinned:
            self._lru[model.name] = None
            self._loads_since_compaction += 1
        log.debug("loaded weights of %r (%d bytes) in %.4f s", model.name, model.nbytes, seconds)
        if self._observer is not None:
            self._observer.loaded(model.name, model.nbytes, seconds, self._resident_bytes())

    def _evict(self, model: _Model) -> None:
        assert not model.pinned and model.in_use == 0 and model.resident is not None
        arrays, model.resident = model.resident, None
        self._lru.pop(model.name, None)
        self._transfer.delete(arrays)
        model.evictions += 1
        log.debug("evicted weights of %r (%d bytes)", model.name, model.nbytes)
        if self._observer is not None:
            self._observer.evicted(model.name, model.nbytes, self._resident_bytes())

    def _maybe_compact(self) -> None:
        if self._interval and self._loads_since_compaction >= self._interval:
            self._compact()

    def _compact(self) -> int:
        freed = 0
        for name in list(self._lru):
            model = self._models[name]
            if model.in_use == 0:
                freed += model.nbytes
                self._evict(model)
        self._compactions += 1
        self._loads_since_compaction = 0
        log.info("memory compacted: %d on-demand weight bytes freed", freed)
        return freed


class BundleWeights:
    """A bundle's weights file, read as memory-mapped views (no copy until used)."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle

    @property
    def nbytes(self) -> int:
        return self.bundle.weight_nbytes

    def read(self) -> list[np.ndarray]:
        """Memory-mapped views in ``weights.order``; NotFoundError for a weight not in the file."""
        path = self.bundle.weights_path
        order = self.bundle.manifest.weights.order
        if path is None or not order:
            return []
        return mmap_tensors(path, order)
