"""Coalescing requests into executions at compiled batch sizes, and the array helpers it needs.

The rule is docs/serving.md, "Coalescing rule": requests are never split; an execution takes
whole requests in arrival order up to the largest compiled batch size, and its item count is
padded (zeros) up to the smallest compiled batch size that holds it. Outputs are sliced back
per request, in order.

Everything here is pure NumPy. The batch axis is an argument everywhere: models served with
``max_batch_size: 0`` may carry their batch axis anywhere (``shape: "kn"``).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hloserve.bundle.front_spec import SpecTensor


@dataclass(frozen=True)
class Execution:
    """One call of a compiled executable, made of whole requests.

    Attributes:
        requests: indices into the planned request list, consecutive and in arrival order.
        offsets: where each request's items start in the batch (same order as ``requests``).
        sizes: each request's item count (same order as ``requests``).
        batch_size: the compiled batch size the execution runs at (``>= items``).
    """

    requests: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    batch_size: int

    @property
    def items(self) -> int:
        """Real items (the rest, ``batch_size - items``, is zero padding)."""
        return sum(self.sizes)

    @property
    def padding(self) -> int:
        """Padded items: ``batch_size - items``."""
        return self.batch_size - self.items


def smallest_holding(items: int, compiled_sizes: Sequence[int]) -> int:
    """The smallest compiled batch size ``>= items``.

    Args:
        items: item count, at least 1.
        compiled_sizes: the compiled batch sizes, ascending.

    Raises:
        ValueError: ``items`` is below 1 or above the largest compiled size.
    """
    if items < 1:
        raise ValueError(f"item count must be at least 1, got {items}")
    i = bisect.bisect_left(compiled_sizes, items)
    if i == len(compiled_sizes):
        raise ValueError(
            f"{items} items exceed the largest compiled batch size {compiled_sizes[-1]}"
        )
    return compiled_sizes[i]


def plan_executions(
    request_batch_sizes: Sequence[int], compiled_sizes: Sequence[int]
) -> list[Execution]:
    """Group requests into executions by docs/serving.md's coalescing rule.

    Greedy in arrival order: a request joins the current execution while the execution's item
    count stays within the largest compiled size; otherwise it starts the next one. Each
    execution then runs at the smallest compiled size holding its items.

    Args:
        request_batch_sizes: each request's item count (batch size), in arrival order.
        compiled_sizes: the compiled batch sizes (any order, no duplicates, all positive).

    Returns:
        The executions, in order; every request appears in exactly one. Empty for no requests.

    Raises:
        ValueError: no compiled size, or a request's size is below 1 or above the largest
            compiled size (the caller rejects such requests before planning).

    Example:
        sizes ``[1, 3, 2, 1]`` with compiled ``[1, 4]`` -> ``[(0, 1) at 4, (2, 3) at 4]``.
    """
    sizes = sorted(compiled_sizes)
    if not sizes:
        raise ValueError("no compiled batch size to plan executions for")
    largest = sizes[-1]
    for i, n in enumerate(request_batch_sizes):
        if not 1 <= n <= largest:
            raise ValueError(
                f"request {i} has batch size {n}; allowed 1 to {largest} (largest compiled size)"
            )
    plan: list[Execution] = []
    members: list[int] = []
    offsets: list[int] = []
    items = 0

    def close() -> None:
        plan.append(
            Execution(
                requests=tuple(members),
                offsets=tuple(offsets),
                sizes=tuple(request_batch_sizes[j] for j in members),
                batch_size=smallest_holding(items, sizes),
            )
        )

    for i, n in enumerate(request_batch_sizes):
        if members and items + n > largest:
            close()
            members, offsets, items = [], [], 0
        members.append(i)
        offsets.append(items)
        items += n
    if members:
        close()
    return plan


def batch_size_of(array: np.ndarray, axis: int) -> int:
    """Size of ``array`` along the batch axis ``axis``."""
    return int(array.shape[axis])


def pad(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``array`` zero-padded along ``axis`` up to ``size`` items (returned as is if equal).

    Raises:
        ValueError: ``array`` already has more than ``size`` items on ``axis``.
    """
    have = array.shape[axis]
    if have == size:
        return array
    if have > size:
        raise ValueError(f"cannot pad {have} items down to {size} along axis {axis}")
    return concatenate([array], axis, size)


def concatenate(arrays: Sequence[np.ndarray], axis: int, size: int | None = None) -> np.ndarray:
    """Concatenate ``arrays`` along ``axis`` and zero-pad the result up to ``size`` items.

    One allocation and one copy per array; a single array that already has ``size`` items is
    returned without a copy. Zero padding is all-zero bytes: 0, ``False``, ``+0.0``.

    Args:
        arrays: at least one array; all of one dtype and equal on every axis but ``axis``.
        axis: the batch axis (non-negative, or negative from the end).
        size: total items along ``axis``; default the sum of the arrays' items.

    Raises:
        ValueError: no arrays, mixed dtypes or shapes, or more items than ``size``.
    """
    if not arrays:
        raise ValueError("concatenate needs at least one array")
    first = arrays[0]
    axis = axis % first.ndim
    total = sum(a.shape[axis] for a in arrays)
    size = total if size is None else size
    if total > size:
        raise ValueError(f"{total} items do not fit in {size} along axis {axis}")
    if len(arrays) == 1 and total == size:
        return first
    shape = list(first.shape)
    shape[axis] = size
    out = np.zeros(shape, dtype=first.dtype)
    start = 0
    rest = first.shape[:axis] + first.shape[axis + 1 :]
    for a in arrays:
        if a.dtype != first.dtype:
            raise ValueError(f"cannot concatenate dtypes {first.dtype} and {a.dtype}")
        if a.ndim != first.ndim or a.shape[:axis] + a.shape[axis + 1 :] != rest:
            raise ValueError(
                f"cannot concatenate shapes {first.shape} and {a.shape} along axis {axis}"
            )
        stop = start + a.shape[axis]
        if axis == 0:
            out[start:stop] = a
        else:
            out[_index(first.ndim, axis, start, stop)] = a
        start = stop
    return out


def split(array: np.ndarray, axis: int, sizes: Sequence[int]) -> list[np.ndarray]:
    """Consecutive slices of ``array`` along ``axis`` with ``sizes`` items each (views).

    Items past ``sum(sizes)`` (padding) are dropped.

    Raises:
        ValueError: ``sizes`` add up to more than the array holds.
    """
    axis = axis % array.ndim
    if sum(sizes) > array.shape[axis]:
        raise ValueError(f"sizes {list(sizes)} exceed {array.shape[axis]} items on axis {axis}")
    out = []
    start = 0
    for n in sizes:
        stop = start + n
        out.append(array[start:stop] if axis == 0 else array[_index(array.ndim, axis, start, stop)])
        start = stop
    return out


def _index(ndim: int, axis: int, start: int, stop: int) -> tuple[slice, ...]:
    return tuple(slice(start, stop) if d == axis else slice(None) for d in range(ndim))


def pad_variable(spec: SpecTensor, array: np.ndarray, variant: Mapping[str, int]) -> np.ndarray:
    """``array`` zero-padded at the end of each variable axis up to the variant's size."""
    if not variant:
        return array
    for axis, letter in enumerate(spec.shape):
        if letter in variant and array.shape[axis] < variant[letter]:
            array = pad(array, axis, variant[letter])
    return array


def unpad_outputs(
    specs: Sequence[SpecTensor], outputs: dict[str, np.ndarray], sizes: Mapping[str, int]
) -> dict[str, np.ndarray]:
    """Each output cut back, on its variable axes, to the request's own sizes (views)."""
    if not sizes:
        return outputs
    cut = {}
    for spec in specs:
        array = outputs[spec.name]
        index = tuple(
            slice(0, sizes[letter]) if letter in sizes else slice(None) for letter in spec.shape
        )
        cut[spec.name] = array[index]
    return cut


__all__ = [
    "Execution",
    "batch_size_of",
    "concatenate",
    "pad",
    "pad_variable",
    "plan_executions",
    "smallest_holding",
    "split",
    "unpad_outputs",
]
