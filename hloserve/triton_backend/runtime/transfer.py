"""Host <-> device weight transfers with JAX: the weight cache's :class:`Transfer`.

Figures (pinned vs pageable, per-transfer cost) are docs/on_demand_weights.md, "GPU figures"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from hloserve.triton_backend.channel import aligned


class JaxTransfer:
    """:class:`Transfer` with JAX, one ``device_put`` call: pinned host memory on accelerators,
    NumPy on CPU."""

    def to_host(self, arrays: Sequence[np.ndarray], device: Any) -> list[Any]:
        if not arrays:
            return []
        sharding = memory_sharding(device, "pinned_host")
        if sharding is None:
            return [np.array(a, copy=True, order="C") for a in arrays]
        import jax

        placed = list(jax.device_put(list(arrays), sharding))
        jax.block_until_ready(placed)
        return placed

    def to_device(self, arrays: Sequence[Any], device: Any) -> list[Any]:
        if not arrays:
            return []
        import jax

        target = memory_sharding(device, None) or device
        placed = list(jax.device_put(list(arrays), target))
        jax.block_until_ready(placed)
        return placed

    def delete(self, arrays: Sequence[Any]) -> None:
        for array in arrays:
            if hasattr(array, "delete") and not array.is_deleted():
                array.delete()


def memory_sharding(device: Any, memory_kind: str | None) -> Any:
    """``SingleDeviceSharding(device, memory_kind)`` (None: the default kind), or None when the
    device lacks the kind (CPU: no ``pinned_host``)."""
    from jax.sharding import SingleDeviceSharding

    if memory_kind is None:
        try:
            memory_kind = device.default_memory().kind
        except (AttributeError, RuntimeError, ValueError):
            return None
    elif device.platform == "cpu":
        return None
    try:
        kinds = {m.kind for m in device.addressable_memories()}
    except (AttributeError, RuntimeError, ValueError):
        return None
    if memory_kind not in kinds:
        return None
    return SingleDeviceSharding(device, memory_kind=memory_kind)


@dataclass(frozen=True)
class PackedHost:
    """A model's weights in the host tier as contiguous uint8 chunks, with each chunk's
    ``(offset, shape, dtype name)`` per array, in argument order."""

    chunks: tuple[Any, ...]
    layout: tuple[tuple[tuple[int, tuple[int, ...], str], ...], ...]


class PackedJaxTransfer(JaxTransfer):
    """:class:`JaxTransfer` moving a model's weights as chunks of ``chunk_bytes``, each in one
    transfer, split on the device (peak: the model plus one chunk); unpinned reads move as
    :class:`JaxTransfer` moves them."""

    def __init__(self, chunk_bytes: int = 64 << 20) -> None:
        self.chunk_bytes = chunk_bytes

    def to_host(self, arrays: Sequence[np.ndarray], device: Any) -> list[Any]:
        if not arrays:
            return []
        groups: list[list[np.ndarray]] = [[]]
        size = 0
        for array in arrays:
            if groups[-1] and size + array.nbytes > self.chunk_bytes:
                groups.append([])
                size = 0
            groups[-1].append(array)
            size += aligned(array.nbytes)
        chunks, layout = [], []
        for group in groups:
            buffer = np.zeros(sum(aligned(a.nbytes) for a in group), np.uint8)
            entries, offset = [], 0
            for array in group:
                flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                buffer[offset : offset + flat.size] = flat
                entries.append((offset, tuple(array.shape), np.dtype(array.dtype).name))
                offset += aligned(array.nbytes)
            chunks.append(buffer)
            layout.append(tuple(entries))
        return [PackedHost(tuple(super().to_host(chunks, device)), tuple(layout))]

    def to_device(self, arrays: Sequence[Any], device: Any) -> list[Any]:
        if len(arrays) != 1 or not isinstance(arrays[0], PackedHost):
            return super().to_device(arrays, device)
        packed = arrays[0]
        out: list[Any] = []
        for chunk, entries in zip(packed.chunks, packed.layout, strict=True):
            (placed,) = super().to_device([chunk], device)
            out += _splitter(entries)(placed)
            self.delete([placed])
        import jax

        jax.block_until_ready(out)
        return out


@cache
def _splitter(entries: tuple[tuple[int, tuple[int, ...], str], ...]) -> Any:
    """A jitted function: uint8 chunk -> the typed arrays ``entries`` describe."""
    import jax
    import ml_dtypes  # noqa: F401  (registers bfloat16 & co. as NumPy dtype names)
    from jax import lax

    def split(chunk: Any) -> list[Any]:
        out = []
        for offset, shape, name in entries:
            dtype = np.dtype(name)
            count = int(np.prod(shape, dtype=np.int64))
            piece = lax.slice(chunk, (offset,), (offset + count * dtype.itemsize,))
            if dtype == np.bool_:
                typed = piece != 0
            elif dtype.itemsize == 1:
                typed = lax.bitcast_convert_type(piece, dtype)
            else:
                typed = lax.bitcast_convert_type(piece.reshape(count, dtype.itemsize), dtype)
            out.append(typed.reshape(shape))
        return out

    return jax.jit(split)
