"""The one compile path: StableHLO portable artifact -> loaded XLA executable (PJRT
``compile_and_load``; JAX 0.7.1 and 0.10.2), and PJRT serialization for the executable cache."""

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

from hloserve.bundle.stablehlo import Signature, TensorType, read_signature, to_portable_artifact
from hloserve.errors import InvalidArgumentError
from hloserve.triton_backend.runtime.executable_cache import (
    COMPILED,
    FROM_CACHE,
    CacheKey,
    ExecutableCache,
    ExecutableLabel,
)

log = logging.getLogger("hloserve.triton_backend.runtime.compile")


def enable_x64() -> None:
    """Turn on JAX's 64-bit mode, so i64/u64/f64 tensors keep their width (the runtime's)."""
    import jax

    jax.config.update("jax_enable_x64", True)


def run_cpu_inline() -> None:
    """Have JAX's CPU backend execute on the calling thread (``jax_cpu_enable_async_dispatch``
    off, docs/serving.md, "Requests"; no effect on GPU); call before ``jax.devices()``."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


@dataclass(frozen=True)
class CompiledExecutable:
    """A loaded XLA executable for one StableHLO ``main`` on one device; ``signature``: its
    argument types (weights first, then inputs) and result types."""

    loaded: Any
    signature: Signature
    device: Any
    from_cache: bool = False

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        """Execute on one array per ``main`` argument (weights, then inputs; host arrays placed
        first, 64-bit ones need :func:`enable_x64`); one ``jax.Array`` per result.
        InvalidArgumentError for a wrong argument count, shape or dtype (position, expected vs
        actual)."""
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
        from hloserve.bundle.dtypes import from_stablehlo

        return tuple(
            (tuple(t.shape), from_stablehlo(t.element_type).numpy) for t in self.signature.inputs
        )

    def run_numpy(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        """:meth:`__call__` on host arrays, returning host NumPy arrays."""
        return [np.asarray(out) for out in self(args)]


def compile_artifact(
    artifact: bytes,
    device: Any | None = None,
    *,
    cache: ExecutableCache | None = None,
    label: ExecutableLabel | None = None,
) -> CompiledExecutable:
    """Compile a StableHLO module (portable artifact or MLIR text) for ``device`` (default the
    first), or load it from ``cache`` (a bad entry is logged and rewritten); ``label`` names it.
    ArtifactError: unreadable module; InvalidArgumentError: XLA refuses it (XLA's message)."""
    import jax
    import jax.extend as jex
    from jax._src.lib import xla_client

    artifact = to_portable_artifact(artifact)
    dev = device if device is not None else jax.devices()[0]
    options = xla_client.CompileOptions()
    key = None
    if cache is not None and cache.enabled:
        start = time.perf_counter()
        key = executable_key(artifact, dev, options, label)
        entry = cache.get(key, label)
        if entry is not None:
            try:
                # the stored signature: parsing the module again costs more than deserializing
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
                cache.counted(label, FROM_CACHE, time.perf_counter() - start)
                return CompiledExecutable(loaded, signature, dev, from_cache=True)
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
    return CompiledExecutable(loaded, signature, dev)


def _signature_to_json(signature: Signature) -> dict[str, Any]:
    def types(tensors: Sequence[TensorType]) -> list[Any]:
        return [[list(t.shape), t.element_type] for t in tensors]

    return {"inputs": types(signature.inputs), "outputs": types(signature.outputs)}


def _signature_from_json(data: Any) -> Signature:
    """Inverse of :func:`_signature_to_json` (KeyError, TypeError, ValueError otherwise)."""

    def types(items: Any) -> tuple[TensorType, ...]:
        return tuple(TensorType(tuple(shape), str(element)) for shape, element in items)

    return Signature(types(data["inputs"]), types(data["outputs"]))


def serialize_executable(loaded: Any) -> bytes:
    """PJRT's serialized form of a loaded executable; XlaRuntimeError where unsupported."""
    client = loaded.client
    if hasattr(client, "serialize_executable"):
        return bytes(client.serialize_executable(loaded))
    return bytes(loaded.serialize())


def deserialize_executable(payload: bytes, device: Any, compile_options: Any = None) -> Any:
    """A loaded executable on ``device`` from :func:`serialize_executable`'s (trusted: loading runs
    code) bytes; XlaRuntimeError when this jaxlib and device cannot load them."""
    from jax._src.lib import xla_client

    options = compile_options if compile_options is not None else xla_client.CompileOptions()
    return device.client.deserialize_executable(payload, xla_client.DeviceList((device,)), options)


def executable_key(
    artifact: bytes, device: Any, compile_options: Any, label: ExecutableLabel | None = None
) -> CacheKey:
    """The executable cache key of compiling ``artifact`` for ``device`` in this process."""
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
