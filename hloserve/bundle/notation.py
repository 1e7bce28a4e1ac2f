"""The manifest's named-axis tensor notation, as plain functions (docs/bundles.md).

A tensor's ``shape`` is a row-major string of single letters (NumPy/JAX order) and ``dims``
gives the size of each letter but the batch letter: ``"nhwc"`` with ``{h: 8, w: 8, c: 1}`` is
an array of shape ``(batch, 8, 8, 1)``. The manifest's typed tensors
(:class:`hloserve.bundle.manifest.TensorSpec`) and the front's spec
(:class:`hloserve.bundle.front_spec.SpecTensor`) both answer through these functions, so the
rules live once. Imports nothing beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping

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


def shape_at(
    shape: str,
    dims: Mapping[str, int],
    batch_size: int,
    sizes: Mapping[str, int] | None = None,
) -> tuple[int, ...]:
    """Row-major shape with the batch axis (if any) set to ``batch_size``.

    Args:
        shape: the axis letters.
        dims: the size of each non-batch letter (:data:`VARIABLE` for a variable axis).
        batch_size: size of the batch axis.
        sizes: sizes of variable axes, e.g. a variant's ``dims``; a variable axis not in
            ``sizes`` stays ``-1``.
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


__all__ = ["BATCH_LETTERS", "VARIABLE", "batch_axis", "shape_at", "variable_axes"]
