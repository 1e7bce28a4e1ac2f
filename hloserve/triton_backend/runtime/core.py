"""The runtime model's core: the one JAX process, compiling and running every bundle its fronts
hold, by reference count per generation (docs/serving.md, "Front -> runtime (the channel)",
Loading); a bundle that fails to load keeps its error, the others serve."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle.bundle import Bundle
from hloserve.bundle.manifest import UNBATCHED
from hloserve.bundle.validate import check_bundle
from hloserve.errors import HloserveError, InvalidArgumentError, NotFoundError, Status
from hloserve.model_parameters import ModelArgs, RuntimeParameters
from hloserve.triton_backend.runtime.compile import (
    CompiledExecutable,
    compile_artifact,
    enable_x64,
    run_cpu_inline,
)
from hloserve.triton_backend.runtime.config import (
    ObserverFactory,
    executable_cache_from_args,
    weight_cache_from_args,
)
from hloserve.triton_backend.runtime.executable_cache import ExecutableCache, ExecutableLabel
from hloserve.triton_backend.runtime.weight_cache import WeightCache

log = logging.getLogger("hloserve.triton_backend.runtime")

#: (artifact, device, label=ExecutableLabel) -> executable, e.g. :func:`compile_artifact`
Compile = Callable[..., CompiledExecutable]


@dataclass(frozen=True)
class LoadedBundle:
    """A bundle ready to run: ``key`` is ``name``, or ``name#<n>`` for a generation loaded while
    an older one is held; ``executables`` by (variant index, compiled batch size, 0 unbatched)."""

    name: str
    key: str
    bundle: Bundle
    executables: Mapping[tuple[int, int], CompiledExecutable]
    load_seconds: float


def generation(path: Path) -> tuple[Any, ...]:
    """What tells two bundles at ``path`` apart: the directory and its manifest file's identity
    (device, inode, size, modification time in ns); a rebuilt repository changes it."""
    path = Path(path)
    try:
        st = (path / "manifest.yaml").stat()
    except OSError:
        return (str(path),)
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def variant_label(dims: Mapping[str, int]) -> str:
    """A variant's label: its axis letters and sizes, e.g. ``"s32"``; ``""`` for no variant."""
    return "".join(f"{letter}{size}" for letter, size in sorted(dims.items()))


@dataclass
class _Entry:
    name: str
    key: str
    path: Path
    generation: tuple[Any, ...] = ()
    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: LoadedBundle | None = None
    error: HloserveError | None = None
    refs: int = 0


class RuntimeModel:
    """Runs the executables of the bundles its fronts load, on one device (JAX x64 on, CPU
    executions inline). ``on_load(key)`` runs before a bundle loads (metrics show a failed one)."""

    def __init__(
        self,
        *,
        store: WeightCache | None = None,
        device: Any | None = None,
        compile: Compile = compile_artifact,
        on_load: Callable[[str], None] | None = None,
    ) -> None:
        enable_x64()
        run_cpu_inline()
        self._on_load = on_load
        self.executable_cache: ExecutableCache | None = None
        import jax

        self.device = device if device is not None else jax.devices()[0]
        self.store = store if store is not None else WeightCache()  # no budget: all resident
        self._compile = compile
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._execute_lock = threading.Lock()
        self._place = _placer(self.device)

    @classmethod
    def from_args(
        cls,
        args: ModelArgs,
        *,
        observer: ObserverFactory | None = None,
        executables: Callable[[str, str], None] | None = None,
        **kwargs: Any,
    ) -> RuntimeModel:
        """Build from the runtime model's Triton config (docs/serving.md, "Runtime model
        config"): unless given, ``store`` is the configured weight cache (reporting to
        ``observer``) and ``compile`` uses the configured executable cache (counted by
        ``executables``). InvalidArgumentError for a malformed parameter."""
        RuntimeParameters.from_parameters(args.name, args.parameters)  # every one valid
        run_cpu_inline()  # before the first jax.devices()
        if "store" not in kwargs:
            if kwargs.get("device") is None:
                import jax

                kwargs["device"] = jax.devices()[0]
            kwargs["store"] = weight_cache_from_args(
                args, device=kwargs["device"], observer=observer
            )
        cache = None if "compile" in kwargs else executable_cache_from_args(args, executables)
        if cache is not None:
            kwargs["compile"] = functools.partial(compile_artifact, cache=cache)
        runtime = cls(**kwargs)
        runtime.executable_cache = cache
        return runtime

    @property
    def bundle_names(self) -> list[str]:
        """The names of the bundles held, sorted."""
        with self._lock:
            return sorted({e.name for e in self._entries.values()})

    def acquire(
        self, name: str, path: Path, progress: Callable[[], None] | None = None
    ) -> LoadedBundle:
        """Hold bundle ``name`` at ``path``, loading it if no one holds this generation; pair
        each call with one :meth:`release` of its ``key``. ``progress()`` runs after each
        executable made ready. Raises the bundle's load error (nothing held then)."""
        path = Path(path)
        gen = generation(path)
        with self._lock:
            entry = next(
                (
                    e
                    for e in self._entries.values()
                    if e.name == name and e.generation == gen and e.error is None
                ),
                None,
            )
            if entry is None:
                key, n = name, 1
                while key in self._entries:
                    n += 1
                    key = f"{name}#{n}"
                entry = self._entries[key] = _Entry(name, key, path, gen)
            entry.refs += 1
        try:
            return self._load_entry(entry, progress)
        except HloserveError:
            self.release(entry.key)
            raise

    def release(self, key: str) -> bool:
        """Let go of one hold on ``key``; whether that unloaded it (the last hold)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return False
            entry.refs -= 1
            if entry.refs > 0:
                return False
            del self._entries[key]
        with entry.lock:
            if entry.loaded is not None:
                self.store.remove(key)
                log.info("model %r (%s) unloaded", entry.name, key)
            entry.loaded = None
        return True

    def load(self, name: str) -> LoadedBundle:
        """The loaded bundle ``name`` (its newest held generation), loading it on first use;
        NotFoundError (no one holds ``name``) or the bundle's load error."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                held = [e for e in self._entries.values() if e.name == name]
                entry = held[-1] if held else None
        if entry is None:
            raise NotFoundError(
                f"runtime: no model {name!r}; this runtime serves {self.bundle_names}"
            )
        return self._load_entry(entry)

    def _load_entry(
        self, entry: _Entry, progress: Callable[[], None] | None = None
    ) -> LoadedBundle:
        if entry.loaded is not None:
            return entry.loaded
        name = entry.name
        with entry.lock:
            if entry.loaded is None and entry.error is None:
                try:
                    entry.loaded = self._load(name, entry.key, entry.path, progress)
                except HloserveError as exc:
                    entry.error = HloserveError(
                        f"model {name!r} failed to load: {exc.message}", status=exc.status
                    )
                except Exception as exc:  # a bug or an XLA/IO failure outside our errors
                    log.exception("model %r failed to load", name)
                    entry.error = HloserveError(
                        f"model {name!r} failed to load: {type(exc).__name__}: {exc}",
                        status=Status.INTERNAL,
                    )
            if entry.error is not None:
                raise entry.error
            assert entry.loaded is not None
            return entry.loaded

    def _load(
        self, name: str, key: str, path: Path, progress: Callable[[], None] | None
    ) -> LoadedBundle:
        if self._on_load is not None:
            self._on_load(key)
        start = time.perf_counter()
        bundle = check_bundle(path, name=name)
        sizes = bundle.manifest.batching.compiled_batch_sizes or [UNBATCHED]
        variants = range(len(bundle.manifest.variant_dims))
        executables = {}
        for v in variants:
            for size in sizes:
                executables[(v, size)] = self._compile(
                    bundle.read_artifact(size, v),
                    self.device,
                    label=ExecutableLabel(
                        name, variant_label(bundle.manifest.variant_dims[v]), size
                    ),
                )
                if progress is not None:
                    progress()
        self.store.add(key, bundle, self.device)
        seconds = time.perf_counter() - start
        log.info(
            "model %r loaded in %.2f s (batch sizes %s%s, %d weight bytes)",
            name,
            seconds,
            sizes,
            f", variants {bundle.manifest.variant_dims}" if bundle.manifest.variants else "",
            bundle.weight_nbytes,
        )
        if self.executable_cache is not None:
            log.info("%s", self.executable_cache.summary())
        return LoadedBundle(name, key, bundle, executables, seconds)

    def run(
        self, loaded: LoadedBundle, variant: int, batch_size: int, inputs: Sequence[np.ndarray]
    ) -> list[Any]:
        """One execution of ``loaded`` at (``variant``, ``batch_size``; 0 = UNBATCHED) on host or
        device ``inputs`` in the manifest's order; JAX array outputs in the manifest's order.
        InvalidArgumentError: no such executable."""
        executable = loaded.executables.get((variant, batch_size))
        if executable is None:
            raise InvalidArgumentError(
                f"model {loaded.name!r}: no executable for batch size {batch_size}; "
                f"compiled batch sizes {sorted({s for _, s in loaded.executables})}"
            )
        args = [self._place(a) if isinstance(a, np.ndarray) else a for a in inputs]
        with self._execute_lock:
            weights = self.store.acquire(loaded.key)
            try:
                results = executable([*weights, *args])
                for result in results:  # one execution at a time: finish before the next
                    result.block_until_ready()
            finally:
                self.store.release(loaded.key)
        return list(results)

    def place(self, array: np.ndarray) -> Any:
        """``array`` copied to the runtime's device (a ``jax.Array``)."""
        return self._place(np.array(array))

    def close(self) -> None:
        """Drop every loaded bundle and its weights."""
        with self._lock:
            entries = list(self._entries.values())
        for entry in entries:
            with entry.lock:
                if entry.loaded is not None:
                    self.store.remove(entry.key)
                entry.loaded = None
                entry.error = None


def _placer(device: Any) -> Callable[[np.ndarray], Any]:
    """Places a host array on ``device`` through the PJRT client's ``buffer_from_pyval`` (~6 us
    against ~120 us for ``jax.device_put`` on CPU); host memory may be aliased on CPU."""
    import jax

    client = getattr(device, "client", None)
    if client is None or not hasattr(client, "buffer_from_pyval"):
        return lambda array: jax.device_put(array, device)

    def place(array: np.ndarray) -> Any:
        return client.buffer_from_pyval(np.ascontiguousarray(array), device)

    return place
