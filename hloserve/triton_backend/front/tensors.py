"""Checking request tensors against a manifest's tensor specs (front and meta): errors name the
model, the tensor, expected vs actual, with ``-1`` at the batch axis as Triton shows it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from hloserve.errors import InvalidArgumentError

if TYPE_CHECKING:  # the front's stubs never import the typed manifest (pydantic)
    from hloserve.bundle.front_spec import SpecTensor
    from hloserve.bundle.manifest_sections import TensorSpec

#: A tensor's spec: the typed manifest's (runtime, meta) or the front spec's (front).
Spec: TypeAlias = "TensorSpec | SpecTensor"


class TensorChecker:
    """Checks a set of tensors against fixed specs (the per-spec work done once)."""

    def __init__(self, model: str, role: str, specs: Sequence[Spec]) -> None:
        self.model = model
        self.role = role
        self.specs = list(specs)
        self.names = [s.name for s in self.specs]
        #: (spec, dtype, shape with -1 at the batch axis, batch axis) per tensor
        self._rules = [
            (
                s,
                s.dtype_info.numpy,
                [-1 if i == s.batch_axis else d for i, d in enumerate(s.shape_at(0))],
                s.batch_axis,
            )
            for s in self.specs
        ]

    def __call__(self, tensors: Mapping[str, np.ndarray]) -> int | None:
        """Check names, dtypes, shapes and one common batch size, returned (None: unbatched);
        InvalidArgumentError for a missing or unknown tensor, bad dtype or shape, or differing
        batch sizes."""
        model, role = self.model, self.role
        if len(tensors) != len(self.names) or any(n not in tensors for n in self.names):
            missing = [n for n in self.names if n not in tensors]
            if missing:
                raise InvalidArgumentError(
                    f"model {model!r}: missing {role} {missing[0]!r}; expected {role}s {self.names}"
                )
            unknown = sorted(n for n in tensors if n not in self.names)
            raise InvalidArgumentError(
                f"model {model!r}: unknown {role} {unknown[0]!r}; expected {role}s {self.names}"
            )
        batch: int | None = None
        first = ""
        for spec, dtype, shape, axis in self._rules:
            array = tensors[spec.name]
            if array.dtype != dtype:
                raise InvalidArgumentError(
                    f"model {model!r}: {role} {spec.name!r}: expected dtype "
                    f"{spec.dtype_info.kserve} ({spec.dtype}), got {_dtype_name(array.dtype)}"
                )
            if len(array.shape) != len(shape) or any(
                e != g and e != -1
                for e, g in zip(shape, array.shape)  # noqa: B905
            ):
                raise InvalidArgumentError(
                    f"model {model!r}: {role} {spec.name!r}: expected shape {shape}, "
                    f"got {list(array.shape)}"
                )
            if axis is None:
                continue
            size = int(array.shape[axis])
            if batch is None:
                batch, first = size, spec.name
            elif size != batch:
                raise InvalidArgumentError(
                    f"model {model!r}: {role} {spec.name!r} has batch size {size} but "
                    f"{role} {first!r} has {batch}"
                )
        return batch


def _dtype_name(dtype: np.dtype) -> str:
    from hloserve.bundle import dtypes

    try:
        row = dtypes.from_numpy(dtype)
    except InvalidArgumentError:
        return str(dtype)
    return f"{row.kserve} ({row.token})"
