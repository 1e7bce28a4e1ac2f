"""The one compile path: StableHLO portable artifact -> loaded XLA executable -> call it.

Everything that runs a bundle's executables (the runtime model, the validator's replay tests,
benchmarks) goes through :func:`compile_artifact`, so a JAX API change is fixed in one place.
It uses ``jax.extend.backend.get_backend().compile_and_load`` (the PJRT client), which accepts
StableHLO text, bytecode or a portable artifact; checked on JAX 0.7.1 and 0.10.2.

With an :class:`~hloserve.triton_backend.runtime.executable_cache.ExecutableCache`, a compiled
executable is serialized to disk and later starts deserialize it instead of compiling
(docs/serving.md, "Executable cache"): :func:`serialize_executable` and
:func:`deserialize_executable` wrap PJRT's executable serialization (the client's
``serialize_executable``/``deserialize_executable`` on jaxlib 0.7.1 and 0.10.2; 0.10.2's
``LoadedExecutable.serialize`` where the client lacks the first).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hloserve.bundle.stablehlo import (
    Signature,
    TensorType,
    read_signature,
    to_portable_artifact,
)
from hloserve.errors import InvalidArgumentError
from hloserve.triton_backend.runtime.executable_cache import (
    COMPILED,
    FROM_CACHE,
    CacheKey,
    ExecutableCache,
    ExecutableLabel,
)

log = logging.getLogger("hloserve.triton_backend.runtime.compile")


def _device(device: Any | None) -> Any:
    import jax

    return device if device is not None else jax.devices()[0]


@dataclass(frozen=True)
class CompiledExecutable:
    """A loaded XLA executable for one StableHLO ``main`` on one device.

    Attributes:
        signature: ``main``'s argument and result types (weights first, then inputs).
        device: the JAX device it runs on.
        compile_seconds: wall time of compilation (or of loading it from the executable
            cache), in seconds.
        from_cache: whether it was loaded from the executable cache instead of compiled.
    """

    loaded: Any
    signature: Signature
    device: Any
    compile_seconds: float
    from_cache: bool = False

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        """Execute on device arrays (or host arrays, which are copied to the device first).

        Args:
            args: one array per ``main`` argument, in order (weights, then inputs). Host NumPy
                arrays are placed with ``jax.device_put``; 64-bit dtypes need JAX's x64 mode on
                (:func:`enable_x64`), else JAX would narrow them.

        Returns:
            One ``jax.Array`` per ``main`` result, on :attr:`device`.

        Raises:
            InvalidArgumentError: wrong argument count, or an argument whose shape or dtype
                differs from the signature (named by position, expected vs actual).
        """
        import jax

        expected = self._expected
        if len(args) != len(expected):
            raise InvalidArgumentError(
                f"executable takes {len(expected)} arguments, got {len(args)}"
            )
        placed = [
            arg if isinstance(arg, jax.Array) else jax.device_put(np.asarray(arg), self.device)
            for arg in args
        ]
        for i, (array, (shape, dtype)) in enumerate(zip(placed, expected, strict=True)):
            if array.shape != shape or array.dtype != dtype:
                got = (tuple(array.shape), np.dtype(array.dtype))
                narrowed = dtype.itemsize == 8 and got[1].itemsize == 4
                hint = " (JAX narrowed a 64-bit array: call enable_x64() first)" if narrowed else ""
                raise InvalidArgumentError(
                    f"argument {i}: expected {shape} {dtype}, got {got[0]} {got[1]}{hint}"
                )
        results = self.loaded.execute_sharded(placed)
        return [shards[0] for shards in results.disassemble_into_single_device_arrays()]

    @functools.cached_property
    def _expected(self) -> tuple[tuple[tuple[int | None, ...], np.dtype], ...]:
        """(shape, dtype) of each ``main`` argument, worked out once (checked every call)."""
        return tuple((tuple(t.shape), _numpy_dtype(t.element_type)) for t in self.signature.inputs)

    def run_numpy(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        """:meth:`__call__` on host arrays, returning host NumPy arrays."""
        return [np.asarray(out) for out in self(args)]


def _numpy_dtype(element_type: str) -> np.dtype:
    from hloserve.bundle import dtypes

    return dtypes.from_stablehlo(element_type).numpy


def enable_x64() -> None:
    """Turn on JAX's 64-bit mode for this process, so i64/u64/f64 tensors keep their width.

    The runtime process calls it at start: it only runs compiled executables, whose types are
    fixed, so the mode changes nothing else there.
    """
    import jax

    jax.config.update("jax_enable_x64", True)


def run_cpu_inline() -> None:
    """Have JAX's CPU backend run executions on the calling thread (before its first use).

    JAX's ``jax_cpu_enable_async_dispatch`` (default on) hands each CPU execution to a worker
    thread and returns at once; the runtime waits for every execution before the next anyway
    (one execution at a time), so the hand-off is pure cost: the digits model at batch 4 took
    108 us per execution with it and 76 us without (JAX 0.7.1, 2 CPU cores; CPU time 132 vs
    79 us). The flag takes effect when the CPU client is created, so call this before
    ``jax.devices()``; it changes nothing on GPU.
    """
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


def compile_artifact(
    artifact: bytes,
    device: Any | None = None,
    *,
    cache: ExecutableCache | None = None,
    label: ExecutableLabel | None = None,
) -> CompiledExecutable:
    """Compile a StableHLO module for one device, or load it from the executable cache.

    Args:
        artifact: a portable artifact (or MLIR text as bytes, converted first).
        device: a ``jax.Device``; default the first device of the default backend.
        cache: where compiled executables are kept (:func:`executable_key`); None compiles.
            An entry that does not deserialize is logged, deleted, and recompiled and
            rewritten; a failed write is logged. Each call is counted in ``cache``.
        label: the model, variant and batch size, for the key and messages.

    Returns:
        The loaded executable with its signature and compile (or load) time.

    Raises:
        ArtifactError: the module cannot be read.
        InvalidArgumentError: XLA refuses to compile it (message from XLA).
    """
    import jax.extend as jex
    from jax._src.lib import xla_client

    artifact = to_portable_artifact(artifact)
    dev = _device(device)
    options = xla_client.CompileOptions()
    key = None
    if cache is not None and cache.enabled:
        start = time.perf_counter()
        key = executable_key(artifact, dev, options, label)
        entry = cache.get(key, label)
        if entry is not None:
            try:
                # the signature stored with it: parsing the module again costs more than
                # deserializing (5 ms vs 1.4 ms for digits on CPU, benchmarks/executable_cache.py)
                signature = _signature_from_json(entry.info["signature"])
                loaded = deserialize_executable(entry.payload, dev, options)
            except Exception as exc:  # XlaRuntimeError: another XLA build, a foreign binary
                log.warning(
                    "executable cache: entry for %s does not load (%s: %s); recompiling",
                    label or "an executable",
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                )
                cache.discard(key)
            else:
                seconds = time.perf_counter() - start
                cache.counted(label, FROM_CACHE, seconds)
                return CompiledExecutable(loaded, signature, dev, seconds, from_cache=True)
    signature = read_signature(artifact)
    backend = jex.backend.get_backend(dev.platform)
    start = time.perf_counter()
    try:
        loaded = backend.compile_and_load(artifact, xla_client.DeviceList((dev,)), options)
    except Exception as exc:  # XlaRuntimeError and friends
        raise InvalidArgumentError(f"XLA cannot compile the module: {exc}") from None
    seconds = time.perf_counter() - start
    if cache is not None:
        if key is not None:
            try:
                info = {"signature": _signature_to_json(signature)}
                cache.put(key, serialize_executable(loaded), label, info)
            except Exception as exc:  # serialization unsupported on this platform
                log.warning(
                    "executable cache: cannot serialize %s (%s: %s); not cached",
                    label or "an executable",
                    type(exc).__name__,
                    exc,
                )
        cache.counted(label, COMPILED, seconds)
    return CompiledExecutable(loaded, signature, dev, seconds)


def _signature_to_json(signature: Signature) -> dict[str, Any]:
    def types(tensors: Sequence[TensorType]) -> list[Any]:
        return [[list(t.shape), t.element_type] for t in tensors]

    return {"inputs": types(signature.inputs), "outputs": types(signature.outputs)}


def _signature_from_json(data: Any) -> Signature:
    """Inverse of :func:`_signature_to_json`.

    Raises:
        KeyError, TypeError, ValueError: not what :func:`_signature_to_json` writes.
    """

    def types(items: Any) -> tuple[TensorType, ...]:
        return tuple(TensorType(tuple(shape), str(element)) for shape, element in items)

    return Signature(types(data["inputs"]), types(data["outputs"]))


def serialize_executable(loaded: Any) -> bytes:
    """PJRT's serialized form of a loaded executable (``compile_and_load``'s result).

    Uses the client's ``serialize_executable`` (jaxlib 0.7.1 and 0.10.2), else the
    executable's own ``serialize`` (jaxlib 0.10.2).

    Raises:
        XlaRuntimeError: the platform cannot serialize executables.
    """
    client = loaded.client
    if hasattr(client, "serialize_executable"):
        return bytes(client.serialize_executable(loaded))
    return bytes(loaded.serialize())


def deserialize_executable(payload: bytes, device: Any, compile_options: Any = None) -> Any:
    """A loaded executable on ``device`` from :func:`serialize_executable`'s bytes.

    Only for trusted bytes: loading a serialized executable may run code (XLA's warning on
    ``deserialize_executable``).

    Args:
        payload: the serialized executable, made on the same platform, device kind and jaxlib.
        device: the ``jax.Device`` to load it on.
        compile_options: the ``CompileOptions`` it was compiled with (default: default ones).

    Raises:
        XlaRuntimeError: the bytes are not an executable this jaxlib and device can load.
    """
    from jax._src.lib import xla_client

    options = compile_options if compile_options is not None else xla_client.CompileOptions()
    return device.client.deserialize_executable(payload, xla_client.DeviceList((device,)), options)


def executable_key(
    artifact: bytes, device: Any, compile_options: Any, label: ExecutableLabel | None = None
) -> CacheKey:
    """The executable cache key of compiling ``artifact`` for ``device`` now.

    Reads the jaxlib version, the ``XLA_FLAGS`` environment variable and JAX's 64-bit mode of
    this process; the model name in ``label`` is left out (a renamed bundle still hits).
    """
    import jax
    from jax._src import lib

    client = device.client
    return CacheKey(
        artifact_sha256=hashlib.sha256(artifact).hexdigest(),
        platform=str(device.platform),
        platform_version=str(getattr(client, "platform_version", "")),
        device_kind=str(device.device_kind),
        device_id=int(device.id),
        jaxlib_version=f"{lib.version_str}/{getattr(lib, 'jaxlib_extension_version', '')}",
        compile_options_sha256=hashlib.sha256(compile_options.SerializeAsString()).hexdigest(),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        x64=bool(jax.config.read("jax_enable_x64")),
        variant=label.variant if label is not None else "",
        batch_size=label.batch_size if label is not None else 0,
    )
