"""The manifest's named-axis tensor notation (docs/bundles.md), without pydantic.

``shape`` is a row-major string of letters, ``dims`` the size of each but the batch letter:
``"nhwc"`` with ``{h: 8, w: 8, c: 1}`` is shape ``(batch, 8, 8, 1)``.
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


def wire_tensors(
    declared: Sequence[_T] | None, tensors: Sequence[_T], carried: set[str]
) -> list[_T]:
    """The tensors clients send or receive: ``declared`` (client tensors) when given, else
    ``tensors`` less the state-``carried`` names."""
    if declared is not None:
        return list(declared)
    return [t for t in tensors if t.name not in carried]  # type: ignore[attr-defined]


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
        return next((i for i, c in enumerate(self.shape) if c in BATCH_LETTERS), None)

    def shape_at(self, batch_size: int, sizes: Mapping[str, int] | None = None) -> tuple[int, ...]:
        """Row-major shape with the batch axis (if any) set to ``batch_size``.

        ``sizes``: of variable axes, e.g. a variant's ``dims``; one not in it stays -1.
        """
        sizes = sizes or {}
        return tuple(
            batch_size
            if c in BATCH_LETTERS
            else sizes.get(c, self.dims[c])
            if self.dims[c] == VARIABLE
            else self.dims[c]
            for c in self.shape
        )

    @property
    def variable_axes(self) -> list[str]:
        """Letters whose size is :data:`VARIABLE` (varies between variants), in shape order."""
        return [c for c in self.shape if self.dims.get(c) == VARIABLE]
