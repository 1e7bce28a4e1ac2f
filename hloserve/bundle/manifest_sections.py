"""The sections of a bundle manifest: tensors, batching, variants, weights, meta, state.

docs/bundles.md, "manifest.yaml", describes each field; :mod:`hloserve.bundle.manifest` the whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from hloserve.bundle import dtypes, notation
from hloserve.bundle.notation import BATCH_LETTERS, VARIABLE

#: ``executables`` key of a symbolic-batch artifact (written ``symbolic`` in YAML).
SYMBOLIC = -1
_SYMBOLIC_TEXT = "symbolic"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
#: Model names Triton accepts as repository directory names (and hloserve as bundle names).
MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def repeated(items: list[str]) -> list[str]:
    """The items that occur more than once, sorted."""
    return sorted({i for i in items if items.count(i) > 1})


def _inside_bundle(path: str) -> str | None:
    """Why ``path`` may not name a file of the bundle (relative, no ``..``), or None."""
    parts = path.replace("\\", "/").split("/")
    if path.startswith("/") or ".." in parts or not path.strip():
        return f"{path!r} must be a relative path inside the bundle (no '..', not absolute)"
    return None


def _tensor_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"tensor name {value!r} must match {_NAME.pattern}")
    return value


class TensorSpec(BaseModel, notation.TensorNotation):
    """One executable tensor: name, dtype token, named-axis ``shape`` and ``dims``.

    ``"nhwc"`` with ``dims: {h: 8, w: 8, c: 1}`` is shape ``(batch, 8, 8, 1)``
    (:mod:`hloserve.bundle.notation`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    _allow_bytes: ClassVar[bool] = False

    name: Annotated[str, AfterValidator(_tensor_name)]
    dtype: str
    shape: str
    dims: dict[str, int] = Field(default_factory=dict)
    #: Triton's ``label_filename``: one label per class (the one non-batch axis), per line
    labels: str | None = None
    #: Triton's ``format`` of an image input (three non-batch axes)
    format: Literal["NHWC", "NCHW"] | None = None

    @model_validator(mode="after")
    def _rules(self) -> TensorSpec:
        problems = []
        if self.dtype not in dtypes.TOKENS:
            problems.append(
                f"unknown dtype token {self.dtype!r}; known: {', '.join(dtypes.TOKENS)}"
            )
        elif self.dtype == "bytes" and not self._allow_bytes:
            problems.append(
                "dtype 'bytes' is not allowed on an executable tensor "
                "(only on client-facing tensors that a hook turns into numbers)"
            )
        seen: set[str] = set()
        for letter in self.shape:
            if not ("a" <= letter <= "z" or "A" <= letter <= "Z"):
                problems.append(f"shape {self.shape!r}: {letter!r} is not an ASCII letter")
            elif letter in seen:
                problems.append(f"shape {self.shape!r}: axis letter {letter!r} appears twice")
            seen.add(letter)
        batch = [c for c in self.shape if c in BATCH_LETTERS]
        if len(set(batch)) > 1:
            problems.append(
                f"shape {self.shape!r} has two batch letters {batch[0]!r} and {batch[1]!r}; "
                "at most one of 'n'/'b' per tensor"
            )
        problems += [
            f"shape {self.shape!r}: axis {c!r} has no size in dims"
            for c in dict.fromkeys(self.shape)
            if c.isascii() and c.isalpha() and c not in BATCH_LETTERS and c not in self.dims
        ]
        for letter, size in self.dims.items():
            if letter in BATCH_LETTERS:
                problems.append(
                    f"dims gives a size for batch letter {letter!r}; the batch size varies"
                )
            elif letter not in self.shape:
                problems.append(f"dims names {letter!r}, which is not in shape {self.shape!r}")
            elif size <= 0 and size != VARIABLE:
                problems.append(f"dims {letter}: size must be positive, got {size}")
        problems += self._classification_rules()
        if problems:
            raise ValueError(f"tensor {self.name!r}: " + "; ".join(problems))
        return self

    def _classification_rules(self) -> list[str]:
        problems = []
        axes = [c for c in self.shape if c not in BATCH_LETTERS]
        if self.labels is not None:
            problems += [f"labels: {p}" for p in [_inside_bundle(self.labels)] if p]
            if len(axes) != 1 or self.dims.get(axes[0], VARIABLE) == VARIABLE:
                problems.append(
                    f"labels need one non-batch axis of a fixed size (the classes); shape "
                    f"{self.shape!r} has {len(axes)} non-batch axes"
                )
        if self.format is not None and len(axes) != 3:
            problems.append(
                f"format {self.format} needs three non-batch axes (an image); shape "
                f"{self.shape!r} has {len(axes)}"
            )
        return problems

    @property
    def nbytes_per_item(self) -> int:
        """Bytes of one batch item (the whole tensor when unbatched)."""
        return math.prod(self.shape_at(1)) * self.dtype_info.itemsize


class ClientTensorSpec(TensorSpec):
    """One ``client_inputs``/``client_outputs`` (wire) tensor; dtype ``bytes`` allowed."""

    _allow_bytes: ClassVar[bool] = True


class MetaSection(BaseModel):
    """``meta`` section of a ``kind: meta`` manifest: ``calls``, the models ``run`` may call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    calls: list[str] = Field(default_factory=list)

    @field_validator("calls")
    @classmethod
    def _calls_ok(cls, calls: list[str]) -> list[str]:
        bad = [c for c in calls if not isinstance(c, str) or not MODEL_NAME.match(c)]
        if bad:
            raise ValueError(f"meta.calls: {bad} are not model names ({MODEL_NAME.pattern})")
        if dup := repeated(calls):
            raise ValueError(f"meta.calls names a model twice: {dup}")
        return calls


class SymbolicBatch(BaseModel):
    """``batching.symbolic``: the batch sizes ``min`` (>= 1) to ``max`` (None: no bound)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = 1
    max: int | None = None

    @model_validator(mode="after")
    def _bounds_ok(self) -> SymbolicBatch:
        if self.min < 1:
            raise ValueError(f"symbolic.min must be at least 1, got {self.min}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"symbolic.max {self.max} is below symbolic.min {self.min}")
        return self

    def violation(self, size: int) -> str | None:
        """The constraint ``size`` breaks (e.g. ``"b >= 2"``), or None when it meets them all."""
        if size < self.min:
            return f"b >= {self.min}"
        if self.max is not None and size > self.max:
            return f"b <= {self.max}"
        return None


def _executable_keys(value: Any) -> Any:
    """Read the YAML key ``symbolic`` as :data:`SYMBOLIC`."""
    if isinstance(value, Mapping):
        return {SYMBOLIC if k == _SYMBOLIC_TEXT else k: v for k, v in value.items()}
    return value


class Batching(BaseModel):
    """``batching`` section; with ``symbolic`` the sizes may be empty (chosen at repo build)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compiled_batch_sizes: list[int] = Field(default_factory=list)
    symbolic: SymbolicBatch | None = None

    @field_validator("compiled_batch_sizes")
    @classmethod
    def _sizes_ok(cls, sizes: list[int]) -> list[int]:
        bad = [s for s in sizes if s <= 0]
        if bad:
            raise ValueError(f"compiled batch sizes must be positive, got {bad}")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"compiled batch sizes repeat a size: {sizes}")
        return sorted(sizes)


class Variant(BaseModel):
    """One shape variant: sizes of the variable axes, its executables by batch size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dims: dict[str, int]
    executables: dict[int, str]

    _keys = field_validator("executables", mode="before")(_executable_keys)

    @field_validator("dims")
    @classmethod
    def _dims_ok(cls, dims: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in dims.items() if v <= 0}
        if bad:
            raise ValueError(f"variant sizes must be positive, got {bad}")
        return dims


class Variants(BaseModel):
    """``variants`` section: executables differing in non-batch axes (docs/bundles.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pick: Literal["smallest_fitting"] = "smallest_fitting"
    shapes: list[Variant]


class Weights(BaseModel):
    """``weights`` section: the safetensors file and the order ``main`` takes the weights in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str | None = None
    order: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rules(self) -> Weights:
        if dup := repeated(self.order):
            raise ValueError(f"weights.order names a weight twice: {dup}")
        if self.order and not self.file:
            raise ValueError("weights.order is not empty but weights.file is missing")
        why = _inside_bundle(self.file) if self.file else None
        if why:
            raise ValueError(f"weights.file {why}")
        return self


#: Triton's default ``max_sequence_idle_microseconds`` (model_config.proto).
MAX_SEQUENCE_IDLE_US = 1_000_000


class Sequencing(BaseModel):
    """``sequence``: Triton's sequence batcher settings of a stateful model (docs/bundles.md).

    ``max_candidate_sequences`` 0 means the largest compiled batch size.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_sequence_idle_microseconds: int = Field(default=MAX_SEQUENCE_IDLE_US, gt=0)
    max_candidate_sequences: int = Field(default=0, ge=0)


class StateSpec(BaseModel):
    """One ``state`` entry: an input fed the ``output`` of the sequence's previous request.

    ``initial`` (at START): ``zeros`` or ``weight:NAME`` (docs/bundles.md, "Stateful bundles").
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str
    output: str
    initial: str = "zeros"

    @field_validator("initial")
    @classmethod
    def _initial_ok(cls, value: str) -> str:
        if value != "zeros" and not (value.startswith("weight:") and len(value) > len("weight:")):
            raise ValueError(f"initial must be 'zeros' or 'weight:NAME', got {value!r}")
        return value

    @property
    def initial_weight(self) -> str | None:
        """The weight holding the initial value, None for zeros."""
        return self.initial.removeprefix("weight:") if self.initial != "zeros" else None
