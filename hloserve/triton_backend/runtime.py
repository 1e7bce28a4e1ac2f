"""The runtime model's core: the one JAX process that compiles and runs every bundle.

docs/serving.md, "Front -> runtime (BLS)": the runtime model has one instance per GPU. Its
inputs and outputs are namespaced ``<bundle>__<tensor>``; a request names one bundle. A bundle
is loaded on the first request that names it (checked, every compiled batch size compiled
through :func:`~hloserve.triton_backend.compile.compile_artifact` (one executable per
shape variant and batch size), weights handed to the
:class:`~hloserve.triton_backend.weights.WeightStore`), once, under a per-bundle lock. A bundle
that fails to load keeps failing with its own error; the other bundles keep serving.
Executions run one at a time.
"""

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

from hloserve.bundle import Bundle
from hloserve.bundle.manifest import UNBATCHED
from hloserve.bundle.validate import check_bundle
from hloserve.errors import HloserveError, InvalidArgumentError, NotFoundError, Status
from hloserve.model_repository_tools import names
from hloserve.triton_backend.compile import CompiledExecutable, compile_artifact, enable_x64
from hloserve.triton_backend.executable_cache import ExecutableLabel
from hloserve.triton_backend.executable_cache_settings import executable_cache_from_args
from hloserve.triton_backend.pb import ModelArgs
from hloserve.triton_backend.tensors import TensorChecker
from hloserve.triton_backend.weight_cache import CacheObserver, Residency, WeightCache
from hloserve.triton_backend.weights import ResidentWeightStore, WeightStore, acquired

log = logging.getLogger("hloserve.triton_backend.runtime")

#: (artifact, device, label=ExecutableLabel) -> executable, e.g. :func:`compile_artifact`.
Compile = Callable[..., CompiledExecutable]
#: Makes the weight cache's observer from (budget bytes or None, model names).
ObserverFactory = Callable[[int | None, Sequence[str]], CacheObserver]

#: Optional runtime parameter: "true" (default) loads every bundle in ``initialize``, "false"
#: loads each on the first request naming it. Triton refuses inference (BLS included) until the
#: server is ready, and in ``--model-control-mode=none`` it is ready only once every model has
#: loaded, so front warmups cannot trigger the loading; preloading makes "server ready" mean
#: "every executable compiled".
PARAM_PRELOAD = "hloserve.preload"


@dataclass(frozen=True)
class LoadedBundle:
    """A bundle ready to run.

    Attributes:
        name: the model name (its runtime tensor prefix).
        bundle: the checked bundle.
        executables: by ``(variant index, compiled batch size)``; variant 0 for a model
            without shape variants, batch size ``0`` for an unbatched model.
        load_seconds: wall time of checking, compiling and placing weights, in seconds.
        check_inputs: checks a request's inputs against the manifest.
    """

    name: str
    bundle: Bundle
    executables: Mapping[tuple[int, int], CompiledExecutable]
    load_seconds: float
    check_inputs: TensorChecker

    def variant_of(self, tensors: Mapping[str, np.ndarray]) -> int:
        """Index of the variant whose sizes equal the inputs' variable axes (0 if none vary).

        Raises:
            InvalidArgumentError: no variant has exactly these sizes (the front pads requests
                up to a variant; the runtime does not).
        """
        manifest = self.bundle.manifest
        if manifest.variants is None:
            return 0
        sizes = {
            letter: int(tensors[spec.name].shape[axis])
            for spec in manifest.inputs
            for axis, letter in enumerate(spec.shape)
            if letter in spec.variable_axes
        }
        for i, dims in enumerate(manifest.variant_dims):
            if dims == sizes:
                return i
        raise InvalidArgumentError(
            f"model {self.name!r}: no executable for variable axis sizes {sizes}; "
            f"variants {manifest.variant_dims}"
        )


@dataclass
class _Entry:
    path: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: LoadedBundle | None = None
    error: HloserveError | None = None


class RuntimeModel:
    """Runs the executables of every bundle of a repository on one device.

    Args:
        registry: bundle (model) name -> bundle directory.
        store: where weights live; default :class:`ResidentWeightStore`.
        device: the ``jax.Device`` to run on; default JAX's first device.
        compile: the compile function (``compile_artifact``; injectable for tests).
        preload: load every bundle now (see :meth:`preload`) instead of on first use.
        on_execute: called after each execution with (model, variant label as given by
            :func:`variant_label`, compiled batch size), e.g. to count executions.

    Calls :func:`~hloserve.triton_backend.compile.enable_x64` (64-bit dtypes keep their width).
    """

    def __init__(
        self,
        registry: Mapping[str, Path],
        *,
        store: WeightStore | None = None,
        device: Any | None = None,
        compile: Compile = compile_artifact,
        preload: bool = False,
        on_execute: Callable[[str, str, int], None] | None = None,
    ) -> None:
        enable_x64()
        import jax

        self.device = device if device is not None else jax.devices()[0]
        self.store: WeightStore = store if store is not None else ResidentWeightStore()
        self._compile = compile
        self._on_execute = on_execute
        self._entries = {name: _Entry(Path(path)) for name, path in registry.items()}
        self._bundle_names = frozenset(self._entries)
        self._execute_lock = threading.Lock()
        self._place = _placer(self.device)
        if preload:
            self.preload()

    @classmethod
    def from_args(
        cls,
        args: ModelArgs,
        *,
        observer: ObserverFactory | None = None,
        executables: Callable[[str, str], None] | None = None,
        **kwargs: Any,
    ) -> RuntimeModel:
        """Build from the runtime model's Triton config (docs/serving.md, "Runtime model config").

        ``hloserve.bundles`` lists the bundle names; each bundle is at
        ``<repository>/<name>/1/bundle``, the repository being the model directory's parent.
        ``hloserve.preload`` (:data:`PARAM_PRELOAD`, default "true") loads them all now.
        Unless ``store`` is given, weights live in a :class:`WeightCache` set from the weight
        cache parameters (:func:`weight_cache_from_args`), reporting to
        ``observer(budget_bytes, model_names)`` (e.g. Triton metrics). Unless ``compile`` is
        given, executables go through the executable cache of the runtime's parameters
        (docs/serving.md, "Executable cache"), each counted by ``executables(model, source)``;
        after preloading, the log says how many were compiled and how many loaded from the cache.

        Raises:
            InvalidArgumentError: a parameter is missing or malformed.
        """
        listed = args.parameter(names.PARAM_BUNDLES)
        repository = args.model_dir.parent
        registry = {
            name: repository / name / names.BUNDLE_SUBDIR
            for name in (n.strip() for n in listed.split(names.BUNDLES_SEPARATOR))
            if name
        }
        preload = args.parameter(PARAM_PRELOAD, "true").strip().lower()
        if preload not in ("true", "false"):
            raise InvalidArgumentError(
                f"model {args.name!r}: parameter {PARAM_PRELOAD!r} must be 'true' or 'false', "
                f"got {preload!r}"
            )
        kwargs.setdefault("preload", preload == "true")
        if "store" not in kwargs:
            if kwargs.get("device") is None:
                import jax

                kwargs["device"] = jax.devices()[0]
            kwargs["store"] = weight_cache_from_args(
                args, set(registry), device=kwargs["device"], observer=observer
            )
        # executable cache (executable_cache.py): the compile path, then one summary log line
        cache = None if "compile" in kwargs else executable_cache_from_args(args, executables)
        if cache is not None:
            kwargs["compile"] = functools.partial(compile_artifact, cache=cache)
        runtime = cls(registry, **kwargs)
        if cache is not None and kwargs["preload"]:
            log.info("%s", cache.summary())
        return runtime

    @property
    def bundle_names(self) -> list[str]:
        """The registered bundle names, sorted."""
        return sorted(self._entries)

    # -- loading ------------------------------------------------------------------------------

    def preload(self) -> dict[str, HloserveError]:
        """Load every registered bundle now: those the store pins first, each group by name.

        A bundle that fails keeps its error (requests naming it get it); the others load.

        Returns:
            The errors of the bundles that failed, by name.
        """
        failed = {}
        for name in sorted(self.bundle_names, key=lambda n: (not self.store.pinned(n), n)):
            try:
                self.load(name)
            except HloserveError as exc:
                log.error("%s", exc.message)
                failed[name] = exc
        return failed

    def load(self, name: str) -> LoadedBundle:
        """The loaded bundle ``name``, loading it on first use (once; thread-safe).

        Raises:
            NotFoundError: ``name`` is not registered.
            HloserveError: the bundle failed to load (now or before): its error, naming it.
        """
        entry = self._entries.get(name)
        if entry is None:
            raise NotFoundError(
                f"runtime: no model {name!r}; this runtime serves {self.bundle_names}"
            )
        if entry.loaded is not None:
            return entry.loaded
        with entry.lock:
            if entry.loaded is None and entry.error is None:
                try:
                    entry.loaded = self._load(name, entry.path)
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

    def _load(self, name: str, path: Path) -> LoadedBundle:
        start = time.perf_counter()
        bundle = check_bundle(path, name=name)
        sizes = bundle.manifest.batching.compiled_batch_sizes or [UNBATCHED]
        variants = range(len(bundle.manifest.variant_dims))
        executables = {
            (v, size): self._compile(
                bundle.read_artifact(size, v),
                self.device,
                label=ExecutableLabel(name, variant_label(bundle.manifest.variant_dims[v]), size),
            )
            for v in variants
            for size in sizes
        }
        self.store.add(name, bundle, self.device)
        seconds = time.perf_counter() - start
        log.info(
            "model %r loaded in %.2f s (batch sizes %s%s, %d weight bytes)",
            name,
            seconds,
            sizes,
            f", variants {bundle.manifest.variant_dims}" if bundle.manifest.variants else "",
            bundle.weight_nbytes,
        )
        checker = TensorChecker(name, "input", bundle.manifest.inputs)
        return LoadedBundle(name, bundle, executables, seconds, checker)

    # -- serving ------------------------------------------------------------------------------

    def execute(
        self, inputs: Mapping[str, Any], requested_outputs: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Run one request: inputs of one bundle at one compiled batch size.

        Args:
            inputs: namespaced input tensors (``<bundle>__<tensor>``), host NumPy arrays.
            requested_outputs: namespaced output names to return; empty for all of them.

        Returns:
            Namespaced outputs: JAX arrays in host memory on a CPU device, else host NumPy
            arrays (both DLPack-exportable; ``np.asarray`` gives NumPy).

        Raises:
            NotFoundError: a tensor name that no registered bundle prefixes.
            InvalidArgumentError: no inputs, inputs of two bundles, a missing/unknown/bad
                tensor, a batch size without an executable, an unknown requested output.
            HloserveError: the bundle failed to load (its status).
        """
        if not inputs:
            raise InvalidArgumentError("runtime: the request has no inputs")
        name, tensors = self._split(inputs)
        loaded = self.load(name)
        manifest = loaded.bundle.manifest
        batch = loaded.check_inputs(tensors)
        variant = loaded.variant_of(tensors)
        key = UNBATCHED if batch is None else batch
        executable = loaded.executables.get((variant, key))
        if executable is None:
            raise InvalidArgumentError(
                f"model {name!r}: no executable for batch size {batch}; "
                f"compiled batch sizes {sorted({s for _, s in loaded.executables})}"
            )
        wanted = self._wanted(name, manifest.outputs, requested_outputs)
        args = [self._place(tensors[spec.name]) for spec in manifest.inputs]
        with self._execute_lock, acquired(self.store, name) as weights:
            results = executable([*weights, *args])
            for result in results:  # one execution at a time: finish before the next
                result.block_until_ready()
        if self._on_execute is not None:
            self._on_execute(name, variant_label(manifest.variant_dims[variant]), key)
        out = {}
        for spec, result in zip(manifest.outputs, results, strict=True):
            if spec.name in wanted:
                out[names.runtime_tensor_name(name, spec.name)] = _to_host(result)
        return out

    def _split(self, inputs: Mapping[str, Any]) -> tuple[str, dict[str, np.ndarray]]:
        bundle: str | None = None
        tensors: dict[str, np.ndarray] = {}
        for full in inputs:
            try:
                owner, tensor = names.split_runtime_tensor_name(full, self._bundle_names)
            except KeyError:
                raise NotFoundError(
                    f"runtime: input {full!r} names no model this runtime serves "
                    f"(expected '<model>__<tensor>' with a model of {self.bundle_names})"
                ) from None
            if bundle is not None and owner != bundle:
                raise InvalidArgumentError(
                    f"runtime: one request names two models, {bundle!r} and {owner!r}"
                )
            bundle = owner
            tensors[tensor] = inputs[full]
        assert bundle is not None
        return bundle, tensors

    def _wanted(self, name: str, specs: Sequence[Any], requested: Sequence[str]) -> set[str]:
        """Names (un-namespaced) of the outputs of ``name`` to return.

        Triton requests every output of the runtime's config when a client names none, so
        requested outputs of other bundles are ignored; none of this bundle means all of them.
        """
        available = {names.runtime_tensor_name(name, s.name): s.name for s in specs}
        wanted = set()
        for full in requested:
            if full in available:
                wanted.add(available[full])
                continue
            try:
                owner, _ = names.split_runtime_tensor_name(full, self._bundle_names)
            except KeyError:
                owner = name
            if owner == name:
                raise InvalidArgumentError(
                    f"model {name!r}: unknown output {full!r}; outputs are {sorted(available)}"
                )
        return wanted or set(available.values())

    def close(self) -> None:
        """Drop every loaded bundle and its weights."""
        for name, entry in self._entries.items():
            with entry.lock:
                if entry.loaded is not None:
                    self.store.remove(name)
                entry.loaded = None
                entry.error = None


def variant_label(dims: Mapping[str, int]) -> str:
    """A variant's label: its axis letters and sizes, e.g. ``"s32"``; ``""`` for no variant."""
    return "".join(f"{letter}{size}" for letter, size in sorted(dims.items()))


def weight_cache_from_args(
    args: ModelArgs,
    models: set[str],
    *,
    device: Any = None,
    observer: ObserverFactory | None = None,
) -> WeightCache:
    """The runtime's :class:`WeightCache` from its config parameters (docs/on_demand_weights.md).

    ``hloserve.weight_cache_bytes`` (absent/0: no budget) or ``hloserve.weight_cache_fraction``
    (of ``device``'s free memory now), ``hloserve.residency`` (``model=residency,...``),
    ``hloserve.compaction_interval`` (absent/0: off). Logs the budget it chose.

    Raises:
        InvalidArgumentError: a malformed value, bytes and a fraction both, or a residency for
            a model not in ``models``.
    """
    budget = _budget(args, device)
    interval = _count_parameter(args, names.PARAM_COMPACTION_INTERVAL)
    try:
        listed = names.parse_residency(args.parameter(names.PARAM_RESIDENCY, ""))
    except ValueError as exc:
        raise InvalidArgumentError(
            f"model {args.name!r}: parameter {names.PARAM_RESIDENCY!r}: {exc}"
        ) from None
    unknown = sorted(set(listed) - models)
    if unknown:
        raise InvalidArgumentError(
            f"model {args.name!r}: parameter {names.PARAM_RESIDENCY!r} names models {unknown} "
            f"that this runtime does not serve ({sorted(models)})"
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
        observer=observer(budget or None, sorted(models)) if observer else None,
    )


def _budget(args: ModelArgs, device: Any) -> int:
    """Bytes from ``hloserve.weight_cache_bytes``, or ``hloserve.weight_cache_fraction`` of
    ``device``'s free memory (``bytes_limit - bytes_in_use``); 0 = no budget."""
    budget = _count_parameter(args, names.PARAM_WEIGHT_CACHE_BYTES)
    text = args.parameter(names.PARAM_WEIGHT_CACHE_FRACTION, "").strip()
    if not text:
        return budget
    key = names.PARAM_WEIGHT_CACHE_FRACTION
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0.0 < fraction <= 1.0:
        raise InvalidArgumentError(
            f"model {args.name!r}: parameter {key!r} must be a number in (0, 1], got {text!r}"
        )
    if budget:
        raise InvalidArgumentError(
            f"model {args.name!r}: parameters {names.PARAM_WEIGHT_CACHE_BYTES!r} and {key!r} "
            "both set the budget; keep one"
        )
    try:
        stats = device.memory_stats() if device is not None else None
    except (AttributeError, RuntimeError):
        stats = None
    if not stats or "bytes_limit" not in stats:
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


def _count_parameter(args: ModelArgs, key: str) -> int:
    text = args.parameter(key, "0").strip() or "0"
    if not text.isdigit():
        raise InvalidArgumentError(
            f"model {args.name!r}: parameter {key!r} must be a non-negative integer, got {text!r}"
        )
    return int(text)


def _placer(device: Any) -> Callable[[np.ndarray], Any]:
    """A function placing a host array on ``device`` as a ``jax.Array``.

    Uses the PJRT client's ``buffer_from_pyval`` (~6 us for a small array on CPU, against
    ~120 us for ``jax.device_put``, JAX 0.7.1); falls back to ``jax.device_put`` where the
    client lacks it. Host memory may be aliased on CPU, as ``jax.device_put`` does: the
    arrays must not change until the execution has finished.
    """
    import jax

    client = getattr(device, "client", None)
    if client is None or not hasattr(client, "buffer_from_pyval"):
        return lambda array: jax.device_put(array, device)

    def place(array: np.ndarray) -> Any:
        return client.buffer_from_pyval(np.ascontiguousarray(array), device)

    return place


def _to_host(array: Any) -> Any:
    """A result in host memory: the JAX array itself on a CPU device, else a NumPy copy."""
    devices = array.devices() if hasattr(array, "devices") else set()
    if devices and all(d.platform == "cpu" for d in devices):
        return array
    return np.asarray(array)


__all__ = ["LoadedBundle", "RuntimeModel", "variant_label", "weight_cache_from_args"]
