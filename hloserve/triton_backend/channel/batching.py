"""Array helpers of coalescing and shape variants (pure NumPy): the runtime concatenates and
splits works on the batch axis (an argument: ``max_batch_size: 0`` models carry it anywhere);
the front pads a request's variable axes to its variant and cuts its outputs back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hloserve.bundle.front_spec import SpecTensor


def pad(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``array`` zero-padded along ``axis`` up to ``size`` items; ValueError when it has more."""
    have = array.shape[axis]
    if have == size:
        return array
    if have > size:
        raise ValueError(f"cannot pad {have} items down to {size} along axis {axis}")
    return concatenate([array], axis, size)


def concatenate(arrays: Sequence[np.ndarray], axis: int, size: int | None = None) -> np.ndarray:
    """Concatenate one dtype's ``arrays`` along ``axis``, zero-padded up to ``size`` items, in
    one allocation (none for one array of ``size``); ValueError: no arrays, mixed dtypes or
    shapes, too many items."""
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
    """Consecutive views of ``array`` along ``axis`` with ``sizes`` items each (padding past
    their sum dropped); ValueError when they add up to more than the array holds."""
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
