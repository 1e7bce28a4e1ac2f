"""The bundle manifest (``manifest.yaml``): typed model, parser, and cross-section rules.

Format versions (docs/bundles.md shows each): 1 ``kind: model``, one artifact per compiled
batch size; 2 ``kind: meta``, ``client_inputs``/``client_outputs``, ``variants``; 3
``batching.symbolic``; 4 ``state``. A manifest may keep the oldest version that expresses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hloserve.bundle.manifest_sections import (
    _SYMBOLIC_TEXT,
    SYMBOLIC,
    Batching,
    ClientTensorSpec,
    MetaSection,
    Sequencing,
    StateSpec,
    TensorSpec,
    Variants,
    Weights,
    _executable_keys,
    _inside_bundle,
    repeated,
)
from hloserve.bundle.notation import wire_tensors
from hloserve.errors import ManifestError
from hloserve.settings import error_message

#: Oldest manifest ``format_version`` this release reads.
MIN_FORMAT_VERSION = 1
#: Newest manifest ``format_version`` this release reads.
MAX_FORMAT_VERSION = 4
#: Version written by :mod:`hloserve.export` for a plain model (older releases read it).
FORMAT_VERSION = 1
#: Oldest ``format_version`` that may use ``kind: meta``, client tensors and ``variants``.
META_FORMAT_VERSION = 2
#: Oldest ``format_version`` that may declare ``batching.symbolic``.
SYMBOLIC_FORMAT_VERSION = 3
#: Oldest ``format_version`` that may declare ``state``.
STATE_FORMAT_VERSION = 4

MANIFEST_FILE = "manifest.yaml"
#: What each classification key of a tensor is for (docs/bundles.md, "Classification").
_ROLE = {"labels": "an output clients receive", "format": "an input clients send"}
#: Key of the single executable of a model without a batch axis.
UNBATCHED = 0


class Manifest(BaseModel):
    """A parsed, rule-checked ``manifest.yaml`` (the model name is the directory's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int
    kind: Literal["model", "meta"] = "model"
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    batching: Batching = Field(default_factory=Batching)
    executables: dict[int, str] = Field(default_factory=dict)
    weights: Weights = Field(default_factory=Weights)
    client_inputs: list[ClientTensorSpec] | None = None
    client_outputs: list[ClientTensorSpec] | None = None
    meta: MetaSection | None = None
    variants: Variants | None = None
    state: list[StateSpec] = Field(default_factory=list)
    sequence: Sequencing | None = None
    producer: dict[str, Any] = Field(default_factory=dict)

    _keys = field_validator("executables", mode="before")(_executable_keys)

    @model_validator(mode="after")
    def _rules(self) -> Manifest:
        problems = self._version_rules()
        for section in ("client_inputs", "client_outputs"):
            if dup := repeated([s.name for s in getattr(self, section) or []]):
                problems.append(f"{section} repeat a tensor name: {dup}")
        problems += self._wire_rules()
        if self.kind == "meta":
            problems += self._meta_rules()
        else:
            problems += self._model_rules()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _wire_rules(self) -> list[str]:
        """``labels`` only on outputs clients receive, ``format`` only on inputs they send."""
        problems = []
        wire = {
            "inputs": set(map(id, self.wire_inputs)),
            "outputs": set(map(id, self.wire_outputs)),
        }
        for section in ("inputs", "outputs", "client_inputs", "client_outputs"):
            side = "outputs" if section.endswith("outputs") else "inputs"
            for spec in getattr(self, section) or []:
                key = "labels" if side == "outputs" else "format"
                other = "format" if key == "labels" else "labels"
                if getattr(spec, other) is not None:
                    problems.append(f"{section} {spec.name!r}: {other} is for {_ROLE[other]}")
                if getattr(spec, key) is not None and id(spec) not in wire[side]:
                    problems.append(
                        f"{section} {spec.name!r}: {key} is for {_ROLE[key]}: put it on "
                        f"client_{side}, which clients {'receive' if key == 'labels' else 'send'}"
                    )
        return problems

    def _version_rules(self) -> list[str]:
        uses = [
            ("state", STATE_FORMAT_VERSION, bool(self.state)),
            ("batching.symbolic", SYMBOLIC_FORMAT_VERSION, self.batching.symbolic is not None),
            ("kind 'meta'", META_FORMAT_VERSION, self.kind == "meta"),
        ] + [
            (key, META_FORMAT_VERSION, key in self.model_fields_set)
            for key in ("client_inputs", "client_outputs", "meta", "variants")
        ]
        return [
            f"{key} needs format_version {version} or later, got {self.format_version}"
            for key, version, used in uses
            if used and self.format_version < version
        ]

    def _meta_rules(self) -> list[str]:
        problems = []
        for key in ("inputs", "outputs", "batching", "executables", "weights", "variants", "state"):
            if key in self.model_fields_set:
                problems.append(
                    f"{key}: not allowed with kind 'meta' (a meta model has no executable; "
                    "declare its tensors in client_inputs/client_outputs)"
                )
        if self.meta is None:
            problems.append("meta: required with kind 'meta' (meta.calls lists what run calls)")
        if not self.client_inputs:
            problems.append("client_inputs: required and non-empty with kind 'meta'")
        if not self.client_outputs:
            problems.append("client_outputs: required and non-empty with kind 'meta'")
        return problems

    def _model_rules(self) -> list[str]:
        problems = self._state_rules()
        if self.meta is not None:
            problems.append("meta: only allowed with kind 'meta'")
        required = ("inputs", "outputs") if self.variants else ("inputs", "outputs", "executables")
        for key in required:
            if key not in self.model_fields_set:
                problems.append(f"{key}: required key is missing")
        for section in ("inputs", "outputs"):
            if dup := repeated([s.name for s in getattr(self, section)]):
                problems.append(f"{section} repeat a tensor name: {dup}")
        if not self.outputs and "outputs" in self.model_fields_set:
            problems.append("outputs is empty; a model returns at least one tensor")
        batched = [s.name for s in self.inputs + self.outputs if s.batch_axis is not None]
        unbatched = [s.name for s in self.inputs + self.outputs if s.batch_axis is None]
        sizes = self.batching.compiled_batch_sizes
        symbolic = self.batching.symbolic
        if symbolic is not None:
            problems += self._symbolic_rules(bool(unbatched))
        if batched and unbatched:
            problems.append(
                f"tensors {batched} have a batch axis but {unbatched} do not; "
                "either every input and output has one or none does"
            )
        elif batched and not sizes and symbolic is None:
            problems.append("tensors have a batch axis but batching.compiled_batch_sizes is empty")
        elif not batched and sizes:
            problems.append(
                f"batching.compiled_batch_sizes is {sizes} but no tensor has a batch axis "
                f"('n' or 'b'); an unbatched model has one executable under key {UNBATCHED}"
            )
        expected = set(sizes) if batched else {UNBATCHED}
        if symbolic is not None:
            expected = {SYMBOLIC}
        if self.variants is not None or any(s.variable_axes for s in self.inputs + self.outputs):
            problems += self._variant_rules(expected)
            return problems
        missing, outside, unexpected = _table_rules("executables", self.executables, expected)
        return problems + missing + outside + unexpected

    def _state_rules(self) -> list[str]:
        """Each state pairs an input and an output of one dtype and shape, each used once."""
        problems = []
        ins = {s.name: s for s in self.inputs}
        outs = {s.name: s for s in self.outputs}
        for i, state in enumerate(self.state):
            where = f"state[{i}]"
            a, b = ins.get(state.input), outs.get(state.output)
            if a is None:
                problems.append(f"{where}: input {state.input!r} is not in inputs")
            if b is None:
                problems.append(f"{where}: output {state.output!r} is not in outputs")
            if a and b and (a.dtype, a.shape, a.dims) != (b.dtype, b.shape, b.dims):
                problems.append(
                    f"{where}: input {a.name!r} and output {b.name!r} differ in dtype or shape"
                )
            if a is not None and a.batch_axis is None:
                problems.append(
                    f"{where}: input {a.name!r} needs a batch axis (one row per sequence)"
                )
            weight = state.initial_weight
            if weight is not None and weight not in self.weights.order:
                problems.append(f"{where}: initial weight {weight!r} is not in weights.order")
        for side in ("input", "output"):
            if dup := repeated([getattr(s, side) for s in self.state]):
                problems.append(f"state repeats {side} {dup}")
        if self.state and self.variants is not None:
            problems.append("state: not supported with variants")
        if self.sequence is not None and not self.state:
            problems.append("sequence: only for a stateful model (declare state)")
        return problems

    @property
    def sequencing(self) -> Sequencing:
        """The sequence batcher's settings (``sequence``, or its defaults)."""
        return self.sequence or Sequencing()

    @property
    def stateful(self) -> bool:
        """Whether the model keeps state per sequence (served with the sequence batcher)."""
        return bool(self.state)

    def _symbolic_rules(self, has_unbatched: bool) -> list[str]:
        assert self.batching.symbolic is not None
        problems = [
            f"batching.compiled_batch_sizes: {size} breaks the symbolic batch constraint {broken}"
            for size in self.batching.compiled_batch_sizes
            if (broken := self.batching.symbolic.violation(size))
        ]
        if has_unbatched:
            problems.insert(
                0, "batching.symbolic needs a batch axis ('n' or 'b') on every input and output"
            )
        return problems

    def _variant_rules(self, expected: set[int]) -> list[str]:
        problems = []
        axes = sorted({a for s in self.inputs + self.outputs for a in s.variable_axes})
        from_inputs = {a for s in self.inputs for a in s.variable_axes}
        if self.variants is None:
            return [
                f"dims of axes {axes} are -1 (variable) but there is no variants section "
                "listing their compiled sizes"
            ]
        if not axes:
            problems.append("variants: no executable tensor has a variable axis (-1 in dims)")
        lost = sorted(set(axes) - from_inputs)
        if lost:
            problems.append(f"variable axes {lost} appear in outputs only; inputs must fix them")
        if self.executables:
            problems.append("executables: must be empty with variants (each variant lists its own)")
        seen: list[dict[str, int]] = []
        for i, variant in enumerate(self.variants.shapes):
            where = f"variants.shapes[{i}]"
            if sorted(variant.dims) != axes:
                problems.append(f"{where}: dims give {sorted(variant.dims)}, expected axes {axes}")
            if variant.dims in seen:
                problems.append(f"{where}: repeats sizes {variant.dims}")
            seen.append(variant.dims)
            tables = _table_rules(where, variant.executables, expected, f"{where}.executables")
            problems += tables[0] + tables[2] + tables[1]
        if not self.variants.shapes:
            problems.append("variants.shapes is empty")
        return problems

    @property
    def variant_dims(self) -> list[dict[str, int]]:
        """Each variant's sizes of the variable axes; ``[{}]`` for a model without variants."""
        return [dict(v.dims) for v in self.variants.shapes] if self.variants else [{}]

    @property
    def all_executables(self) -> dict[tuple[int, int], str]:
        """Every executable file by ``(variant index, batch size)``; variant 0 without variants.

        Symbolic batch: each compiled size maps to its variant's one symbolic artifact.
        """
        if self.batching.symbolic is not None:
            return {
                (v, size): file
                for v, file in self.symbolic_executables.items()
                for size in self.batching.compiled_batch_sizes
            }
        return {(i, size): file for i, t in enumerate(self._tables) for size, file in t.items()}

    @property
    def _tables(self) -> list[dict[int, str]]:
        """Each variant's ``executables`` (the top-level one without variants)."""
        if self.variants is None:
            return [self.executables]
        return [v.executables for v in self.variants.shapes]

    @property
    def symbolic_executables(self) -> dict[int, str]:
        """Each variant's symbolic-batch artifact by variant index; empty unless symbolic."""
        if self.batching.symbolic is None:
            return {}
        return {i: t[SYMBOLIC] for i, t in enumerate(self._tables) if SYMBOLIC in t}

    @property
    def is_symbolic(self) -> bool:
        """Whether the batch axis is symbolic (one artifact specialized to each batch size)."""
        return self.batching.symbolic is not None

    @property
    def is_meta(self) -> bool:
        """Whether this is a meta model (Python glue, no executable)."""
        return self.kind == "meta"

    @property
    def calls(self) -> list[str]:
        """The models a meta may call (``meta.calls``); empty for a model."""
        return list(self.meta.calls) if self.meta else []

    @property
    def wire_inputs(self) -> list[TensorSpec]:
        """The tensors clients send (:func:`~hloserve.bundle.notation.wire_tensors`)."""
        return wire_tensors(self.client_inputs, self.inputs, {s.input for s in self.state})

    @property
    def wire_outputs(self) -> list[TensorSpec]:
        """The tensors clients receive (:func:`~hloserve.bundle.notation.wire_tensors`)."""
        return wire_tensors(self.client_outputs, self.outputs, {s.output for s in self.state})

    @property
    def batched(self) -> bool:
        """Whether the model has a batch axis (then every tensor has one)."""
        return bool(self.batching.compiled_batch_sizes) or self.is_symbolic

    @property
    def batch_leading(self) -> bool:
        """Whether every tensor's batch axis is its first axis (Triton's implicit batch dim)."""
        return self.batched and all(s.batch_axis == 0 for s in self.inputs + self.outputs)

    @property
    def max_batch_size(self) -> int:
        """Largest compiled batch size, 0 when unbatched."""
        sizes = self.batching.compiled_batch_sizes
        return max(sizes) if sizes else 0

    def to_yaml(self) -> str:
        """The manifest as YAML text, keys in the documented order."""
        data = self.model_dump(mode="python", exclude_defaults=False, exclude_none=True)
        if not self.state:
            del data["state"]
        if self.is_meta:
            for key in ("inputs", "outputs", "batching", "executables", "weights"):
                del data[key]
        else:
            if not data["weights"].get("file"):
                data["weights"].pop("file", None)
            shapes = data["variants"]["shapes"] if data.get("variants") else []
            for table in [data["executables"], *(v["executables"] for v in shapes)]:
                if SYMBOLIC in table:
                    table[_SYMBOLIC_TEXT] = table.pop(SYMBOLIC)
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def _table_rules(
    where: str, table: dict[int, str], expected: set[int], files_where: str = "executables"
) -> tuple[list[str], list[str], list[str]]:
    """An executables table's keys without a file, files outside the bundle, unexpected keys."""
    return (
        [f"{where}: {_key_text(key)} has no artifact" for key in sorted(expected - set(table))],
        [
            f"{files_where}: {_SYMBOLIC_TEXT if key == SYMBOLIC else key}: {why}"
            for key, file in sorted(table.items())
            if (why := _inside_bundle(file))
        ],
        [f"{where}: {_unexpected_key(key, expected)}" for key in sorted(set(table) - expected)],
    )


def _key_text(key: int) -> str:
    if key == SYMBOLIC:
        return "the symbolic-batch artifact (key 'symbolic')"
    return f"compiled batch size {key}" if key else "the unbatched executable (key 0)"


def _unexpected_key(key: int, expected: set[int]) -> str:
    if key == SYMBOLIC:
        return "key 'symbolic' needs batching.symbolic"
    if expected == {SYMBOLIC}:
        return f"key {key}: a symbolic-batch model has only the key 'symbolic'"
    return f"key {key} is not a compiled batch size {sorted(expected)}"


def _where(data: Any, loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as text, naming the tensor the path goes through."""
    parts: list[str] = []
    node = data
    for key in loc:
        if isinstance(key, int):
            parts[-1] = f"{parts[-1]}[{key}]" if parts else f"[{key}]"
        else:
            parts.append(str(key))
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            node = None
        if isinstance(node, Mapping) and isinstance(node.get("name"), str) and isinstance(key, int):
            parts[-1] += f" {node['name']!r}"
    return ".".join(parts) if parts else "manifest"


def parse_manifest(data: Any, *, path: str = MANIFEST_FILE) -> Manifest:
    """Check and type a manifest loaded from YAML (``path``: the file name in error text); raises
    ManifestError: one line per problem; an unsupported ``format_version`` alone."""
    if not isinstance(data, Mapping):
        raise ManifestError(
            path, [f"expected a mapping at the top level, got {type(data).__name__}"]
        )
    version = data.get("format_version")
    if version is None:
        raise ManifestError(path, ["format_version is missing"])
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestError(path, [f"format_version must be an integer, got {version!r}"])
    if not MIN_FORMAT_VERSION <= version <= MAX_FORMAT_VERSION:
        raise ManifestError(
            path,
            [
                f"format_version {version} is not supported; this hloserve reads versions "
                f"{MIN_FORMAT_VERSION} to {MAX_FORMAT_VERSION}"
            ],
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        problems = [f"{_where(data, tuple(e['loc']))}: {error_message(e)}" for e in exc.errors()]
        raise ManifestError(path, problems) from None


def load_manifest(path: Path) -> Manifest:
    """Read and check ``manifest.yaml``; raises ManifestError: unreadable, not valid YAML, or breaks
    a rule (:func:`parse_manifest`)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(str(path), [f"cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError:
        raise ManifestError(str(path), ["not UTF-8 text (is it a YAML file?)"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError(str(path), [f"not valid YAML: {exc}"]) from None
    return parse_manifest(data, path=str(path))
