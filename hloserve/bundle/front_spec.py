"""The front spec (``<model>/1/front_spec.json``): what a front reads of its bundle's manifest.

Written by ``hloserve repo build`` from the typed manifest (:func:`front_spec`), read with
``json`` so that a front stub never imports pydantic or PyYAML (docs/serving.md). Format 1;
the optional ``state`` key is read as empty when absent.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hloserve.bundle import notation
from hloserve.errors import HloserveError, InvalidArgumentError

if TYPE_CHECKING:
    from hloserve.bundle.bundle import Bundle
    from hloserve.bundle.manifest import Manifest
    from hloserve.bundle.manifest_sections import TensorSpec

#: Layout version of the front spec file.
FRONT_SPEC_FORMAT = 1
#: A stateful front's control inputs (INT32 0/1) by Triton control kind; no CORRID input
#: (docs/bundles.md, "Stateful bundles").
SEQUENCE_CONTROLS = {
    "START": "CONTROL_SEQUENCE_START",
    "END": "CONTROL_SEQUENCE_END",
    "READY": "CONTROL_SEQUENCE_READY",
}


@dataclass(frozen=True)
class SpecTensor(notation.TensorNotation):
    """One tensor of the front spec, in the manifest's notation."""

    name: str
    dtype: str
    shape: str
    dims: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FrontSpec:
    """What the front needs of a ``kind: model`` manifest; names as in :class:`Manifest`."""

    inputs: tuple[SpecTensor, ...]
    outputs: tuple[SpecTensor, ...]
    client_inputs: tuple[SpecTensor, ...] | None = None
    client_outputs: tuple[SpecTensor, ...] | None = None
    compiled_batch_sizes: tuple[int, ...] = ()
    symbolic: bool = False
    variant_dims: tuple[Mapping[str, int], ...] = ({},)
    all_executables: Mapping[tuple[int, int], str] = field(default_factory=dict)
    weights_file: str | None = None
    weights_order: tuple[str, ...] = ()
    state: tuple[tuple[str, str], ...] = ()

    @property
    def wire_inputs(self) -> list[SpecTensor]:
        """The tensors clients send (:func:`~hloserve.bundle.notation.wire_tensors`)."""
        return notation.wire_tensors(self.client_inputs, self.inputs, {i for i, _ in self.state})

    @property
    def wire_outputs(self) -> list[SpecTensor]:
        """The tensors clients receive (:func:`~hloserve.bundle.notation.wire_tensors`)."""
        return notation.wire_tensors(self.client_outputs, self.outputs, {o for _, o in self.state})

    @property
    def batched(self) -> bool:
        """Whether the model has a batch axis (then every tensor has one)."""
        return bool(self.compiled_batch_sizes) or self.symbolic

    @property
    def batch_leading(self) -> bool:
        """Whether every tensor's batch axis is its first axis (Triton's implicit batch dim)."""
        return self.batched and all(s.batch_axis == 0 for s in self.inputs + self.outputs)

    def to_json(self) -> str:
        """The file's text (sorted keys, one line per top-level key)."""
        data = {**dataclasses.asdict(self), "format": FRONT_SPEC_FORMAT}
        executables = sorted(data.pop("all_executables").items())
        data["executables"] = [[v, b, f] for (v, b), f in executables]
        if not self.state:
            del data["state"]
        lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(data.items())]
        return "{\n" + ",\n".join(lines) + "\n}\n"

    @classmethod
    def from_json(cls, text: str, *, path: str = "front_spec.json") -> FrontSpec:
        """Parse :meth:`to_json`'s text; raises InvalidArgumentError: malformed or another format
        (naming the file; rebuild)."""
        rebuild = "(rebuild the repository with `hloserve repo build`)"
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidArgumentError(f"{path}: not valid JSON ({exc}) {rebuild}") from None
        if not isinstance(data, dict) or data.get("format") != FRONT_SPEC_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise InvalidArgumentError(
                f"{path}: front spec format {got!r} is not {FRONT_SPEC_FORMAT}, the one this "
                f"hloserve reads {rebuild}"
            )
        try:
            return cls(
                inputs=_tensors(data["inputs"]),
                outputs=_tensors(data["outputs"]),
                client_inputs=_optional_tensors(data["client_inputs"]),
                client_outputs=_optional_tensors(data["client_outputs"]),
                compiled_batch_sizes=tuple(int(b) for b in data["compiled_batch_sizes"]),
                symbolic=bool(data["symbolic"]),
                variant_dims=tuple(
                    {str(k): int(v) for k, v in d.items()} for d in data["variant_dims"]
                ),
                all_executables={(int(v), int(b)): str(f) for v, b, f in data["executables"]},
                weights_file=None if data["weights_file"] is None else str(data["weights_file"]),
                weights_order=tuple(str(w) for w in data["weights_order"]),
                state=tuple((str(i), str(o)) for i, o in data.get("state", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidArgumentError(
                f"{path}: malformed front spec ({type(exc).__name__}: {exc}) {rebuild}"
            ) from None


def _tensors(items: list[dict[str, Any]]) -> tuple[SpecTensor, ...]:
    return tuple(
        SpecTensor(
            str(i["name"]),
            str(i["dtype"]),
            str(i["shape"]),
            {str(k): int(v) for k, v in i["dims"].items()},
        )
        for i in items
    )


def _optional_tensors(items: list[dict[str, Any]] | None) -> tuple[SpecTensor, ...] | None:
    return None if items is None else _tensors(items)


def _spec_tensors(ts: Sequence[TensorSpec] | None) -> tuple[SpecTensor, ...] | None:
    return (
        None
        if ts is None
        else tuple(SpecTensor(t.name, t.dtype, t.shape, dict(t.dims)) for t in ts)
    )


def front_spec(manifest: Manifest) -> FrontSpec:
    """The front spec of a typed manifest."""
    return FrontSpec(
        inputs=_spec_tensors(manifest.inputs) or (),
        outputs=_spec_tensors(manifest.outputs) or (),
        client_inputs=_spec_tensors(manifest.client_inputs),
        client_outputs=_spec_tensors(manifest.client_outputs),
        compiled_batch_sizes=tuple(manifest.batching.compiled_batch_sizes),
        symbolic=manifest.is_symbolic,
        variant_dims=tuple(manifest.variant_dims),
        all_executables=dict(manifest.all_executables),
        weights_file=manifest.weights.file,
        weights_order=tuple(manifest.weights.order),
        state=tuple((p.input, p.output) for p in manifest.state),
    )


@dataclass(frozen=True)
class FrontBundle:
    """A bundle directory (a repository's ``<model>/1/bundle``) and its front spec."""

    path: Path
    spec: FrontSpec

    @classmethod
    def of(cls, bundle: Bundle | FrontBundle) -> FrontBundle:
        """``bundle`` itself, or the front's view of a typed :class:`Bundle`."""
        if isinstance(bundle, FrontBundle):
            return bundle
        return cls(bundle.path, front_spec(bundle.manifest))

    def executable_path(self, batch_size: int, variant: int = 0) -> Path:
        """Path of the executable for ``batch_size`` (0 unbatched) and ``variant``; raises KeyError:
        no such executable."""
        return self.path / self.spec.all_executables[(variant, batch_size)]

    @property
    def weights_path(self) -> Path | None:
        """Path of the safetensors file, or None for a model without weights."""
        return self.path / self.spec.weights_file if self.spec.weights_file else None


def read_front_spec(path: Path) -> FrontSpec:
    """Read a front spec file (raises InvalidArgumentError: unreadable or malformed)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"{path}: cannot read the front spec: {exc}") from None
    return FrontSpec.from_json(text, path=str(path))


def check_bundle_files(name: str, bundle: Bundle | FrontBundle) -> None:
    """Check without JAX that every executable is a portable artifact (its header) and the
    safetensors header holds every weight ``main`` takes; raises InvalidArgumentError: naming the
    model and the damaged file."""
    from hloserve.bundle.safetensors_file import stored_tensors
    from hloserve.bundle.stablehlo import is_portable_artifact

    bundle = FrontBundle.of(bundle)
    for variant, size in sorted(bundle.spec.all_executables):
        path = bundle.executable_path(size, variant)
        try:
            with path.open("rb") as f:
                head = f.read(64)
        except OSError as exc:
            raise InvalidArgumentError(
                f"model {name!r}: cannot read executable {path}: {exc.strerror}"
            ) from None
        if not is_portable_artifact(head):
            raise InvalidArgumentError(
                f"model {name!r}: {path} is not a StableHLO portable artifact "
                "(rebuild the repository with `hloserve repo build`)"
            )
    try:
        stored = {} if bundle.weights_path is None else stored_tensors(bundle.weights_path)
    except HloserveError as exc:
        raise InvalidArgumentError(f"model {name!r}: {exc.message}") from None
    missing = [w for w in bundle.spec.weights_order if w not in stored]
    if missing:
        raise InvalidArgumentError(f"model {name!r}: {bundle.weights_path} lacks weights {missing}")
