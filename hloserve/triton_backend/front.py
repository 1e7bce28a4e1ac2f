"""The front model's core: validate, preprocess, coalesce, call the runtime, slice, postprocess.

One front model serves one bundle (docs/serving.md, "The generated model repository"). The
Triton shim sends each request through the runtime's channel
(:mod:`hloserve.triton_backend.front_channel`), using :meth:`FrontModel.prepare`,
:meth:`~FrontModel.runtime_inputs` and :meth:`~FrontModel.finish` per request;
:meth:`FrontModel.execute` (executions at compiled batch sizes through an injected
``call_runtime``) serves the in-process tests and benchmarks. A request's own problem (bad
tensor, hook error) fails only that request; a runtime error fails the requests of that
execution.

Hooks (docs/bundles.md, "Hooks"; :mod:`hloserve.triton_backend.hooks`): a bundle's ``model.py``
may define ``preprocess`` and ``postprocess``; they run here, per request, in the front's
instances (never in the runtime).
Shape variants (docs/bundles.md, "Shape variants"): each request runs on the smallest variant
holding its variable axes; its inputs are zero-padded up to the variant's sizes, outputs sliced
back; requests are coalesced only with requests of the same variant.

The front never imports JAX (docs/serving.md: the runtime is the only JAX process), nor the
typed manifest (pydantic, PyYAML): it reads the front spec the repository builder wrote
(:mod:`hloserve.bundle.front_spec`), which keeps each front stub's memory small.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hloserve import names
from hloserve.bundle.front_spec import FrontBundle, SpecTensor, check_bundle_files, read_front_spec
from hloserve.errors import HloserveError, InvalidArgumentError, Status, UnavailableError
from hloserve.model_parameters import FrontParameters
from hloserve.triton_backend import batching
from hloserve.triton_backend.batching import pad_variable, unpad_outputs
from hloserve.triton_backend.hooks import Hooks, IdentityHooks, ModuleHooks, load_hooks
from hloserve.triton_backend.pb import ModelArgs, ServerStartingError
from hloserve.triton_backend.tensors import TensorChecker

if TYPE_CHECKING:
    from hloserve.bundle import Bundle

log = logging.getLogger("hloserve.triton_backend.front")

Tensors = dict[str, np.ndarray]
#: One request's outcome: its output tensors by name, or the error it gets.
Result = Tensors | Exception
#: ``call_runtime(inputs, output_names) -> outputs``: one runtime execution. Names are the
#: runtime's namespaced names (``<bundle>__<tensor>``). Raises HloserveError; UNAVAILABLE means
#: "not ready, retry".
CallRuntime = Callable[[Mapping[str, np.ndarray], Sequence[str]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class RetryPolicy:
    """How long the front waits for a runtime that answers UNAVAILABLE (e.g. still loading).

    Attributes:
        total_s: give up after this many seconds (then the request gets UNAVAILABLE).
        first_delay_s: first wait between attempts, seconds; doubled after each attempt.
        max_delay_s: longest wait between attempts, seconds.
    """

    total_s: float = names.DEFAULT_RUNTIME_WAIT_S
    first_delay_s: float = 0.05
    max_delay_s: float = 1.0


@dataclass
class Prepared:
    """A request checked and preprocessed, with its variant.

    Attributes:
        index: its position in the list it came in.
        inputs: the executable's inputs (after ``preprocess``), by name.
        batch_size: its rows (None for an unbatched model).
        variant: the index of its shape variant.
        sizes: its own sizes of the variable axes (before padding to the variant).
    """

    index: int
    inputs: Tensors
    batch_size: int | None
    variant: int = 0
    #: the request's own sizes of the variable axes (before padding to the variant)
    sizes: dict[str, int] = field(default_factory=dict)


class FrontModel:
    """Serves one bundle by calling the runtime model.

    Args:
        name: the model (= bundle) name: the prefix of its tensors in the runtime model.
        bundle: the bundle: its front spec (a typed :class:`~hloserve.bundle.Bundle` is
            turned into one, :meth:`FrontBundle.of`).
        call_runtime: runs one execution on the runtime (see :data:`CallRuntime`).
        hooks: pre/post processing; identity by default.
        retry: waiting for a runtime that is not ready.
        sleep: ``time.sleep`` (injectable for tests).
        clock: ``time.monotonic`` (injectable for tests).
    """

    def __init__(
        self,
        name: str,
        bundle: Bundle | FrontBundle,
        call_runtime: CallRuntime,
        *,
        hooks: Hooks | None = None,
        retry: RetryPolicy | None = None,
        runtime_model: str = names.RUNTIME_MODEL,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.bundle = FrontBundle.of(bundle)
        #: what the front reads of the bundle's manifest (a FrontSpec; same attribute names)
        self.manifest = self.bundle.spec
        self.runtime_model = runtime_model
        self.hooks: Hooks = hooks if hooks is not None else IdentityHooks()
        self.retry = retry or RetryPolicy()
        self._call_runtime = call_runtime
        self._sleep = sleep
        self._clock = clock
        self._compiled = list(self.manifest.compiled_batch_sizes)
        self._check_inputs = TensorChecker(name, "input", self.manifest.inputs)
        self._check_outputs = TensorChecker(name, "output", self.manifest.outputs)
        self._check_client_inputs = TensorChecker(name, "input", self.manifest.wire_inputs)
        self._check_client_outputs = TensorChecker(name, "output", self.manifest.wire_outputs)
        self._has_client_outputs = self.manifest.client_outputs is not None
        #: per-item scalar inputs (shape "n"): config dims [1] without reshape, so Triton hands
        #: them over as [batch, 1] (model_repository_tools.config explains why)
        self._scalar_inputs = {
            s.name
            for s in self.manifest.wire_inputs
            if self.manifest.batch_leading and s.batch_axis is not None and len(s.shape) == 1
        }
        # identity hooks: the executable's check after "preprocess" is the same check
        self._check_client = not isinstance(self.hooks, IdentityHooks)
        self._variants = [dict(d) for d in self.manifest.variant_dims]
        self._variable = sorted({a for s in self.manifest.inputs for a in s.variable_axes})
        #: variant indices, smallest total size first (smallest_fitting tries them in order)
        self._variant_order = sorted(
            range(len(self._variants)), key=lambda i: (sum(self._variants[i].values()), i)
        )
        self._runtime_inputs = {
            s.name: names.runtime_tensor_name(name, s.name) for s in self.manifest.inputs
        }
        self._runtime_outputs = {
            s.name: names.runtime_tensor_name(name, s.name) for s in self.manifest.outputs
        }

    @classmethod
    def from_args(
        cls, args: ModelArgs, call_runtime: CallRuntime, *, hooks: Hooks | None = None
    ) -> FrontModel:
        """Build from the model's Triton config (docs/serving.md, "Front model config").

        Reads ``hloserve.bundle`` (bundle directory relative to the model directory),
        ``hloserve.runtime_model``, ``hloserve.repository_format`` (checked against the
        supported range) and the optional ``hloserve.runtime_wait_s``; the bundle's front spec
        from ``front_spec.json`` in the bundle's version folder (``names.FRONT_SPEC`` for
        version 1), or, in a repository built before
        the builder wrote one, from the bundle's manifest (which costs the stub the typed
        manifest's imports).

        Raises:
            InvalidArgumentError: a parameter is missing or malformed, or an unsupported
                repository format, or a damaged bundle (:func:`check_bundle_files`).
            NotFoundError / ManifestError: the bundle cannot be read.
        """
        params = FrontParameters.from_parameters(args.name, args.parameters)
        bundle_dir = args.model_dir / params.bundle
        # beside the bundle, in its version folder (``serve --watch`` installs version N+1)
        spec_file = bundle_dir.parent / Path(names.FRONT_SPEC).name
        if spec_file.is_file():
            bundle = FrontBundle(bundle_dir, read_front_spec(spec_file))
        else:
            from hloserve.bundle import load_bundle

            bundle = FrontBundle.of(load_bundle(bundle_dir))
        check_bundle_files(args.name, bundle)
        if hooks is None:
            hooks = load_hooks(args.name, bundle)
        return cls(
            args.name,
            bundle,
            call_runtime,
            hooks=hooks,
            retry=RetryPolicy(total_s=params.runtime_wait_s),
            runtime_model=params.runtime_model,
        )

    # -- serving ------------------------------------------------------------------------------

    def execute(self, requests: Sequence[Mapping[str, np.ndarray] | Exception]) -> list[Result]:
        """Serve a list of requests; one result per request, in order.

        Args:
            requests: each request's input tensors by name (client-facing names), or the
                exception a request already failed with (e.g. an unreadable tensor), which
                is passed through as its result.

        Returns:
            For each request, its output tensors by name or the exception it gets (an
            :class:`~hloserve.errors.HloserveError` carries the status to answer with).
        """
        results: list[Result | None] = [None] * len(requests)
        prepared: list[Prepared] = []
        for i, request in enumerate(requests):
            if isinstance(request, Exception):
                results[i] = request
                continue
            try:
                prepared.append(self.prepare(request, i))
            except Exception as exc:
                results[i] = exc
        for execution, members in self._plan(prepared):
            try:
                outputs = self._run(execution, members)
            except Exception as exc:
                for m in members:
                    results[m.index] = exc
                continue
            for m, request_outputs in zip(members, outputs, strict=True):
                try:
                    results[m.index] = self._postprocess(request_outputs, m.inputs)
                except Exception as exc:
                    results[m.index] = exc
        return [r if r is not None else HloserveError("request was not served") for r in results]

    def prepare(self, request: Mapping[str, np.ndarray], index: int = 0) -> Prepared:
        """Check and preprocess one request; pick its variant (its own problem raises).

        Raises:
            HloserveError: the request's error (INVALID_ARGUMENT for a bad tensor or a hook
                refusing it).
        """
        request = self._drop_unit_axis(request)
        if self._check_client:
            self._check_client_inputs(request)
        inputs = self._preprocess(dict(request))
        batch = self._check_request(inputs)
        variant, sizes = self._pick_variant(inputs)
        return Prepared(index, inputs, batch, variant, sizes)

    def runtime_inputs(self, prepared: Prepared) -> list[np.ndarray]:
        """The executable's inputs for one prepared request, in the manifest's order, each
        zero-padded on its variable axes up to the request's variant (its rows unpadded)."""
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
        """One request's client outputs from its executable outputs (manifest order).

        Raises:
            HloserveError: postprocess failed or broke the contract (INTERNAL).
        """
        named = {spec.name: a for spec, a in zip(self.manifest.outputs, outputs, strict=True)}
        cut = unpad_outputs(self.manifest.outputs, named, prepared.sizes)
        return self._postprocess(cut, prepared.inputs)

    def _drop_unit_axis(self, request: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Per-item scalar inputs as the bundle declares them: ``[batch, 1]`` -> ``[batch]``.

        A repository built before inputs lost their ``reshape`` hands over ``[batch]``
        already; that is kept as is.
        """
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
        """The variant for a request's executable inputs and its sizes of the variable axes.

        ``smallest_fitting``: the first variant (they are tried smallest total size first)
        whose every variable axis holds the request's size.

        Raises:
            InvalidArgumentError: tensors disagree on a variable axis, or no variant holds it.
        """
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

    def _plan(self, prepared: list[Prepared]) -> list[tuple[batching.Execution, list[Prepared]]]:
        if not self.manifest.batched:
            return [(batching.Execution((i,), (0,), (0,), 0), [p]) for i, p in enumerate(prepared)]
        planned = []
        for variant in dict.fromkeys(p.variant for p in prepared):  # first-arrival order
            group = [p for p in prepared if p.variant == variant]
            sizes = [p.batch_size or 1 for p in group]
            plan = batching.plan_executions(sizes, self._compiled)
            planned += [(e, [group[j] for j in e.requests]) for e in plan]
        return planned

    def _run(self, execution: batching.Execution, members: list[Prepared]) -> list[Tensors]:
        """One runtime call for ``members``; their outputs, sliced per request."""
        variant = self._variants[members[0].variant]
        inputs: dict[str, np.ndarray] = {}
        for spec in self.manifest.inputs:
            arrays = [pad_variable(spec, m.inputs[spec.name], variant) for m in members]
            inputs[self._runtime_inputs[spec.name]] = self._assemble(spec, arrays, execution)
        wanted = list(self._runtime_outputs.values())
        raw = self._call_with_retry(inputs, wanted)
        outputs = {
            spec.name: raw.get(self._runtime_outputs[spec.name]) for spec in self.manifest.outputs
        }
        missing = [n for n, a in outputs.items() if a is None]
        if missing:
            raise HloserveError(
                f"model {self.name!r}: runtime model {self.runtime_model!r} returned no "
                f"output {self._runtime_outputs[missing[0]]!r}",
                status=Status.INTERNAL,
            )
        present = {n: np.asarray(a) for n, a in outputs.items()}
        try:
            batch = self._check_outputs(present)
        except InvalidArgumentError as exc:
            raise HloserveError(
                f"runtime model {self.runtime_model!r} broke the contract: {exc.message}",
                status=Status.INTERNAL,
            ) from None
        for spec in self.manifest.outputs:
            got = present[spec.name].shape
            want = spec.shape_at(
                got[spec.batch_axis] if spec.batch_axis is not None else 0, variant
            )
            if tuple(got) != want:
                raise HloserveError(
                    f"model {self.name!r}: runtime returned output {spec.name!r} with shape "
                    f"{list(got)}, expected {list(want)} for variant {variant}",
                    status=Status.INTERNAL,
                )
        if self.manifest.batched and batch != execution.batch_size:
            raise HloserveError(
                f"model {self.name!r}: runtime returned batch size {batch}, "
                f"expected {execution.batch_size}",
                status=Status.INTERNAL,
            )
        if not self.manifest.batched:
            return [unpad_outputs(self.manifest.outputs, present, members[0].sizes)]
        per_request: list[Tensors] = [{} for _ in members]
        for spec in self.manifest.outputs:
            axis = spec.batch_axis
            assert axis is not None  # batched manifests have a batch axis on every tensor
            for out, part in zip(
                per_request, batching.split(present[spec.name], axis, execution.sizes), strict=True
            ):
                out[spec.name] = part
        return [
            unpad_outputs(self.manifest.outputs, out, m.sizes)
            for out, m in zip(per_request, members, strict=True)
        ]

    @staticmethod
    def _assemble(
        spec: SpecTensor, arrays: list[np.ndarray], execution: batching.Execution
    ) -> np.ndarray:
        if spec.batch_axis is None:
            return arrays[0]
        return batching.concatenate(arrays, spec.batch_axis, execution.batch_size)

    def _call_with_retry(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> Mapping[str, np.ndarray]:
        """``call_runtime`` again while it answers UNAVAILABLE, with backoff, bounded in time.

        Raises:
            UnavailableError: still unavailable after ``retry.total_s`` seconds.
            ServerStartingError: Triton refuses BLS because the server is starting (no retry:
                the server cannot become ready while this model is still loading).
            HloserveError: any other error of the runtime, unchanged.
        """
        policy = self.retry
        deadline = self._clock() + policy.total_s
        delay = policy.first_delay_s
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._call_runtime(inputs, outputs)
            except ServerStartingError as exc:
                raise ServerStartingError(
                    f"model {self.name!r}: cannot call runtime model {self.runtime_model!r}: "
                    f"the server is starting or shutting down ({exc.message})"
                ) from None
            except HloserveError as exc:
                if exc.status is not Status.UNAVAILABLE:
                    raise
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise UnavailableError(
                        f"model {self.name!r}: runtime model {self.runtime_model!r} still "
                        f"unavailable after {policy.total_s:g} s ({attempts} attempts): "
                        f"{exc.message}"
                    ) from None
                if attempts == 1:
                    log.warning(
                        "model %r: runtime model %r unavailable (%s); retrying for up to %g s",
                        self.name,
                        self.runtime_model,
                        exc.message,
                        policy.total_s,
                    )
                self._sleep(min(delay, remaining))
                delay = min(delay * 2, policy.max_delay_s)


__all__ = [
    "CallRuntime",
    "FrontModel",
    "Hooks",
    "IdentityHooks",
    "ModuleHooks",
    "Prepared",
    "Result",
    "RetryPolicy",
    "check_bundle_files",
    "load_hooks",
]  # Hooks, IdentityHooks, ModuleHooks, load_hooks: hooks.py; check_bundle_files: front_spec
