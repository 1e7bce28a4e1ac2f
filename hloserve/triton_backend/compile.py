"""The one compile path: StableHLO portable artifact -> loaded XLA executable -> call it.

Everything that runs a bundle's executables (the runtime model, the validator's replay tests,
benchmarks) goes through :func:`compile_artifact`, so a JAX API change is fixed in one place.
It uses ``jax.extend.backend.get_backend().compile_and_load`` (the PJRT client), which accepts
StableHLO text, bytecode or a portable artifact; checked on JAX 0.7.1 and 0.10.2.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hloserve.bundle.stablehlo import Signature, read_signature, to_portable_artifact
from hloserve.errors import InvalidArgumentError


def _device(device: Any | None) -> Any:
    import jax

    return device if device is not None else jax.devices()[0]


@dataclass(frozen=True)
class CompiledExecutable:
    """A loaded XLA executable for one StableHLO ``main`` on one device.

    Attributes:
        signature: ``main``'s argument and result types (weights first, then inputs).
        device: the JAX device it runs on.
        compile_seconds: wall time of compilation, in seconds.
    """

    loaded: Any
    signature: Signature
    device: Any
    compile_seconds: float

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

        expected = self.signature.inputs
        if len(args) != len(expected):
            raise InvalidArgumentError(
                f"executable takes {len(expected)} arguments, got {len(args)}"
            )
        placed = []
        for i, (arg, want) in enumerate(zip(args, expected, strict=True)):
            array = (
                arg if isinstance(arg, jax.Array) else jax.device_put(np.asarray(arg), self.device)
            )
            got = (tuple(array.shape), np.dtype(array.dtype))
            want_dtype = _numpy_dtype(want.element_type)
            if got != (want.shape, want_dtype):
                narrowed = want_dtype.itemsize == 8 and got[1].itemsize == 4
                hint = " (JAX narrowed a 64-bit array: call enable_x64() first)" if narrowed else ""
                raise InvalidArgumentError(
                    f"argument {i}: expected {want.shape} {want_dtype}, got {got[0]} {got[1]}{hint}"
                )
            placed.append(array)
        results = self.loaded.execute_sharded(placed)
        return [shards[0] for shards in results.disassemble_into_single_device_arrays()]

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


def compile_artifact(artifact: bytes, device: Any | None = None) -> CompiledExecutable:
    """Compile a StableHLO module for one device.

    Args:
        artifact: a portable artifact (or MLIR text as bytes, converted first).
        device: a ``jax.Device``; default the first device of the default backend.

    Returns:
        The loaded executable with its signature and compile time.

    Raises:
        ArtifactError: the module cannot be read.
        InvalidArgumentError: XLA refuses to compile it (message from XLA).
    """
    import jax.extend as jex
    from jax._src.lib import xla_client

    artifact = to_portable_artifact(artifact)
    signature = read_signature(artifact)
    dev = _device(device)
    backend = jex.backend.get_backend(dev.platform)
    start = time.perf_counter()
    try:
        loaded = backend.compile_and_load(
            artifact, xla_client.DeviceList((dev,)), xla_client.CompileOptions()
        )
    except Exception as exc:  # XlaRuntimeError and friends
        raise InvalidArgumentError(f"XLA cannot compile the module: {exc}") from None
    return CompiledExecutable(loaded, signature, dev, time.perf_counter() - start)
