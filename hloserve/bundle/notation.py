"""The manifest's named-axis tensor notation, as plain functions (docs/bundles.md).

``shape`` is a row-major string of letters, ``dims`` the size of each but the batch letter:
``"nhwc"`` with ``{h: 8, w: 8, c: 1}`` is shape ``(batch, 8, 8, 1)``. Imports no pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from hloserve.bundle import dtypes

_T = TypeVar("_T")

#: Axis letters that mark the batch axis (at most one per tensor).
BATCH_LETTERS = frozenset("nb")
#: ``dims`` size of an axis whose size varies between ``variants`` (and on client tensors).
VARIABLE = -1


def batch_axis(shape: str) -> int | None:
    """Index of the batch axis in the row-major ``shape``, or None when unbatched."""
    for i, letter in enumerate(shape):
        if letter in BATCH_LETTERS:
            return i
    return None


def wire_tensors(
    declared: Sequence[_T] | None, tensors: Sequence[_T], carried: set[str]
) -> list[_T]:
    """The tensors clients send or receive: ``declared`` (client tensors) when given, else
    ``tensors`` less the state-``carried`` names."""
    if declared is not None:
        return list(declared)
    return [t for t in tensors if t.name not in carried]  # type: ignore[attr-defined]


def shape_at(
    shape: str, dims: Mapping[str, int], batch_size: int, sizes: Mapping[str, int] | None = None
) -> tuple[int, ...]:
    """Row-major shape with the batch axis (if any) set to ``batch_size``.

    ``sizes``: of variable axes, e.g. a variant's ``dims``; a variable axis not in it stays -1.
    """
    sizes = sizes or {}
    return tuple(
        batch_size
        if letter in BATCH_LETTERS
        else sizes.get(letter, dims[letter])
        if dims[letter] == VARIABLE
        else dims[letter]
        for letter in shape
    )


def variable_axes(shape: str, dims: Mapping[str, int]) -> list[str]:
    """Letters whose size is :data:`VARIABLE` (varies between variants), in shape order."""
    return [c for c in shape if dims.get(c) == VARIABLE]


class TensorNotation:
    """What a tensor's ``dtype``, ``shape`` and ``dims`` fields say (a mixin)."""

    if TYPE_CHECKING:
        dtype: str
        shape: str
        dims: Mapping[str, int]

    @property
    def dtype_info(self) -> dtypes.DType:
        """The dtype table row of :attr:`dtype`."""
        return dtypes.from_token(self.dtype)

    @property
    def batch_axis(self) -> int | None:
        """Index of the batch axis in the row-major shape, or None when unbatched."""
        return batch_axis(self.shape)

    def shape_at(self, batch_size: int, sizes: Mapping[str, int] | None = None) -> tuple[int, ...]:
        """:func:`shape_at` of this tensor."""
        return shape_at(self.shape, self.dims, batch_size, sizes)

    @property
    def variable_axes(self) -> list[str]:
        """:func:`variable_axes` of this tensor."""
        return variable_axes(self.shape, self.dims)


__all__ = ["BATCH_LETTERS", "VARIABLE", "TensorNotation", "batch_axis", "shape_at", "variable_axes"]
