"""The front model's core (no JAX, no typed manifest: the builder's front spec): per request
:meth:`FrontModel.prepare` (validate, preprocess, pick the variant), ``runtime_inputs`` (pad),
:meth:`~FrontModel.finish` (cut, postprocess); docs/bundles.md's hooks and variants."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hloserve import names
from hloserve.bundle.front_spec import (
    SEQUENCE_CONTROLS,
    FrontBundle,
    check_bundle_files,
    read_front_spec,
)
from hloserve.errors import HloserveError, InvalidArgumentError, Status
from hloserve.model_parameters import FrontParameters, ModelArgs
from hloserve.triton_backend.channel.batching import pad_variable, unpad_outputs
from hloserve.triton_backend.front.hooks import Hooks, IdentityHooks, Tensors, load_hooks
from hloserve.triton_backend.front.tensors import TensorChecker

if TYPE_CHECKING:
    from hloserve.bundle.bundle import Bundle

log = logging.getLogger("hloserve.triton_backend.front")

#: a sequence's correlation ID (an unsigned integer or a string; 0 and "": no sequence)
SequenceId = int | str


@dataclass
class Prepared:
    """A request checked and preprocessed: its position, executable inputs, rows (None when
    unbatched), variant, own sizes of the variable axes, and (ID, START, END) when stateful."""

    index: int
    inputs: Tensors
    batch_size: int | None
    variant: int = 0
    sizes: dict[str, int] = field(default_factory=dict)
    sequence: tuple[SequenceId, bool, bool] | None = None


def _check_no_corrid(args: ModelArgs) -> None:
    """Refuse a ``CONTROL_SEQUENCE_CORRID`` control input: tritonserver 2.51 writes a string
    sequence ID past its 8 bytes and the stub dies (the front reads the request's ID)."""
    controls = (args.config.get("sequence_batching") or {}).get("control_input") or []
    for control_input in controls:
        kinds = {c.get("kind") for c in control_input.get("control") or []}
        if "CONTROL_SEQUENCE_CORRID" in kinds:
            raise InvalidArgumentError(
                f"model {args.name!r}: its config has the CONTROL_SEQUENCE_CORRID input "
                f"{control_input.get('name')!r}, into which tritonserver 2.51 writes a string "
                "sequence ID past its end (the server dies); regenerate the repository with "
                "`hloserve repo build` (the front reads the ID from the request)"
            )


class FrontModel:
    """Checks, pre/postprocesses and pads one bundle's requests for the runtime (``bundle``: a
    front spec or a typed :class:`~hloserve.bundle.bundle.Bundle`; ``runtime_wait_s``: how long a
    request waits for an absent runtime)."""

    def __init__(
        self,
        name: str,
        bundle: Bundle | FrontBundle,
        *,
        hooks: Hooks | None = None,
        runtime_model: str = names.RUNTIME_MODEL,
        runtime_wait_s: float = names.DEFAULT_RUNTIME_WAIT_S,
    ) -> None:
        self.name = name
        self.bundle = FrontBundle.of(bundle)
        self.manifest = self.bundle.spec
        self.runtime_model = runtime_model
        self.runtime_wait_s = runtime_wait_s
        self.hooks: Hooks = hooks if hooks is not None else IdentityHooks()
        self._compiled = list(self.manifest.compiled_batch_sizes)
        self._check_inputs = TensorChecker(name, "input", self.manifest.inputs)
        self._check_client_inputs = TensorChecker(name, "input", self.manifest.wire_inputs)
        self._check_client_outputs = TensorChecker(name, "output", self.manifest.wire_outputs)
        self._has_client_outputs = self.manifest.client_outputs is not None
        #: per-item scalar inputs (shape "n"): Triton hands them over as [batch, 1]
        self._scalar_inputs = {
            s.name
            for s in self.manifest.wire_inputs
            if self.manifest.batch_leading and s.batch_axis is not None and len(s.shape) == 1
        }
        self._state_in = {i for i, _ in self.manifest.state}
        self._state_out = {o for _, o in self.manifest.state}
        # identity hooks: the executable's check after "preprocess" is the same check
        self._check_client = not isinstance(self.hooks, IdentityHooks)
        self._variants = [dict(d) for d in self.manifest.variant_dims]
        self._variable = sorted({a for s in self.manifest.inputs for a in s.variable_axes})
        self._variant_order = sorted(
            range(len(self._variants)), key=lambda i: (sum(self._variants[i].values()), i)
        )

    @classmethod
    def from_args(cls, args: ModelArgs, *, hooks: Hooks | None = None) -> FrontModel:
        """Build from the model's Triton config (docs/serving.md, "Front model config"; the front
        spec from ``front_spec.json`` beside the bundle, else the manifest). InvalidArgumentError
        (bad parameter or repository format, damaged bundle, a ``CONTROL_SEQUENCE_CORRID``
        input), NotFoundError or ManifestError."""
        params = FrontParameters.from_parameters(args.name, args.parameters)
        _check_no_corrid(args)
        bundle_dir = args.model_dir / params.bundle
        # beside the bundle, in its version folder (``serve --watch`` installs version N+1)
        spec_file = bundle_dir.parent / Path(names.FRONT_SPEC).name
        if spec_file.is_file():
            bundle = FrontBundle(bundle_dir, read_front_spec(spec_file))
        else:
            from hloserve.bundle.bundle import load_bundle

            bundle = FrontBundle.of(load_bundle(bundle_dir))
        check_bundle_files(args.name, bundle)
        if hooks is None:
            hooks = load_hooks(args.name, bundle)
        return cls(
            args.name,
            bundle,
            hooks=hooks,
            runtime_model=params.runtime_model,
            runtime_wait_s=params.runtime_wait_s,
        )

    @property
    def stateful(self) -> bool:
        """Whether the bundle declares ``state`` (Triton's sequence batcher serves it)."""
        return bool(self._state_in)

    def prepare(
        self,
        request: Mapping[str, np.ndarray],
        index: int = 0,
        sequence_id: SequenceId = 0,
    ) -> Prepared:
        """Check and preprocess one request (the client's tensors by name, a stateful model's
        ``sequence_id``); pick its variant. Its own error raises: INVALID_ARGUMENT for a bad
        tensor, a hook refusing it, a stateful model's request without a sequence ID."""
        sequence = None
        if self._state_in:
            request, sequence = self._sequence(request, sequence_id)
        request = self._drop_unit_axis(request)
        if self._check_client:
            self._check_client_inputs(request)
        inputs = self._preprocess(dict(request))
        if sequence is not None:  # the runtime writes each sequence's state over these
            for spec in self.manifest.inputs:
                if spec.name in self._state_in:
                    inputs[spec.name] = np.zeros(spec.shape_at(1), spec.dtype_info.numpy)
        batch = self._check_request(inputs)
        if sequence is not None and batch != 1:
            raise InvalidArgumentError(
                f"model {self.name!r}: a request of a sequence carries one row, got {batch}"
            )
        variant, sizes = self._pick_variant(inputs)
        return Prepared(index, inputs, batch, variant, sizes, sequence)

    def _sequence(
        self, request: Mapping[str, np.ndarray], sequence_id: SequenceId
    ) -> tuple[dict[str, np.ndarray], tuple[SequenceId, bool, bool]]:
        """The request without its control inputs, and (ID, START, END); an ID is required."""
        inputs = dict(request)
        controls = {k: inputs.pop(k) for k in SEQUENCE_CONTROLS if k in inputs}
        # a repository built with a CONTROL_SEQUENCE_CORRID input hands it over too
        inputs.pop("CORRID", None)
        if not sequence_id:
            raise InvalidArgumentError(
                f"model {self.name!r} is stateful: send each request with a sequence ID "
                "(a correlation ID: an unsigned integer or a string) and the START and END flags"
            )

        def flag(key: str) -> bool:
            return key in controls and bool(controls[key].reshape(-1)[0])

        return inputs, (sequence_id, flag("START"), flag("END"))

    def runtime_inputs(self, prepared: Prepared) -> list[np.ndarray]:
        """The executable's inputs in the manifest's order, zero-padded to the variant."""
        variant = self._variants[prepared.variant]
        return [
            np.ascontiguousarray(pad_variable(spec, prepared.inputs[spec.name], variant))
            for spec in self.manifest.inputs
        ]

    def output_shapes(self, prepared: Prepared) -> list[tuple[int, ...]]:
        """Shapes of the executable's outputs for one request (its rows, its variant)."""
        variant = self._variants[prepared.variant]
        rows = prepared.batch_size or 0
        return [spec.shape_at(rows, variant) for spec in self.manifest.outputs]

    def finish(self, prepared: Prepared, outputs: Sequence[np.ndarray]) -> Tensors:
        """One request's client outputs from its executable outputs (manifest order);
        HloserveError INTERNAL when postprocess fails or breaks the contract."""
        named = {spec.name: a for spec, a in zip(self.manifest.outputs, outputs, strict=True)}
        cut = unpad_outputs(self.manifest.outputs, named, prepared.sizes)
        for name in self._state_out:  # the runtime keeps it; clients do not receive it
            cut.pop(name, None)
        return self._postprocess(cut, prepared.inputs)

    def _drop_unit_axis(self, request: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Per-item scalar inputs as the bundle declares them: ``[batch, 1]`` -> ``[batch]``."""
        if not self._scalar_inputs.intersection(request):
            return request
        inputs = dict(request)
        for name in self._scalar_inputs.intersection(inputs):
            array = inputs[name]
            if array.ndim == 2 and array.shape[1] == 1:
                inputs[name] = array.reshape(array.shape[0])
        return inputs

    def _preprocess(self, inputs: Tensors) -> Tensors:
        try:
            return self.hooks.preprocess(inputs)
        except HloserveError:
            raise
        except Exception as exc:  # a hook refusing a request (ValueError, ...): the client's
            raise InvalidArgumentError(
                f"model {self.name!r}: preprocess failed: {type(exc).__name__}: {exc}"
            ) from None

    def _postprocess(self, outputs: Tensors, inputs: Tensors) -> Tensors:
        try:
            result = self.hooks.postprocess(outputs, inputs)
        except HloserveError:
            raise
        except Exception as exc:
            raise HloserveError(
                f"model {self.name!r}: postprocess failed: {type(exc).__name__}: {exc}",
                status=Status.INTERNAL,
            ) from None
        if self._has_client_outputs:
            try:
                self._check_client_outputs(result)
            except InvalidArgumentError as exc:
                raise HloserveError(
                    f"postprocess broke the client_outputs contract: {exc.message}",
                    status=Status.INTERNAL,
                ) from None
        return result

    def _pick_variant(self, inputs: Tensors) -> tuple[int, dict[str, int]]:
        """The first variant (smallest total size first) holding the request's sizes of the
        variable axes, and those sizes; InvalidArgumentError when tensors disagree or none fits."""
        if not self._variable:
            return 0, {}
        sizes: dict[str, int] = {}
        seen: dict[str, str] = {}
        for spec in self.manifest.inputs:
            array = inputs[spec.name]
            for axis, letter in enumerate(spec.shape):
                if letter not in self._variable:
                    continue
                size = int(array.shape[axis])
                if letter in sizes and sizes[letter] != size:
                    raise InvalidArgumentError(
                        f"model {self.name!r}: input {spec.name!r} has size {size} on axis "
                        f"{letter!r} but input {seen[letter]!r} has {sizes[letter]}"
                    )
                sizes[letter] = size
                seen[letter] = spec.name
        for i in self._variant_order:
            if all(sizes[a] <= self._variants[i][a] for a in self._variable):
                return i, sizes
        raise InvalidArgumentError(
            f"model {self.name!r}: no shape variant holds sizes {sizes} of the variable axes; "
            f"variants {self._variants}"
        )

    def _check_request(self, inputs: Tensors) -> int | None:
        batch = self._check_inputs(inputs)
        if not self.manifest.batched:
            return None
        if batch is None:  # a batched model without inputs: one item per request
            return 1
        largest = self._compiled[-1]
        if not 1 <= batch <= largest:
            raise InvalidArgumentError(
                f"model {self.name!r}: batch size {batch} is outside 1 to {largest} "
                f"(compiled batch sizes {self._compiled})"
            )
        return batch
