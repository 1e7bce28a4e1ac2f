"""A meta model's core: load ``run`` from ``model.py``, check tensors, gate, call, deadline.

``run(inputs, call) -> outputs`` takes and returns NumPy arrays by name; ``call(name, inputs)``
runs one of ``meta.calls`` through an injected transport (:data:`Send`). docs/meta_models.md.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hloserve import names, triton_messages
from hloserve.bundle.bundle import Bundle, load_bundle
from hloserve.bundle.files import MODEL_PY, import_model_py
from hloserve.bundle.manifest import Manifest
from hloserve.bundle.manifest_sections import ClientTensorSpec, TensorSpec
from hloserve.errors import (
    DeadlineExceededError,
    HloserveError,
    InvalidArgumentError,
    ModelPyImportError,
    NotFoundError,
    Status,
)
from hloserve.meta.deadline import Deadline
from hloserve.meta.gate import MetaGate, remove_stale_gates, server_gate_dir
from hloserve.model_parameters import MetaParameters, ModelArgs
from hloserve.triton_backend.front.tensors import TensorChecker

log = logging.getLogger("hloserve.meta")

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class ForeignCallee:
    """A Triton model of another backend as a callee, from its ``config.pbtxt``."""

    wire_inputs: list[TensorSpec]
    max_batch_size: int
    client_inputs: None = None

    @property
    def batch_leading(self) -> bool:
        """Whether Triton batches it (batch axis first)."""
        return self.max_batch_size > 0

    @classmethod
    def from_config(cls, config: Any) -> ForeignCallee:
        """From a parsed ``ModelConfig`` (tritonclient's ``model_config_pb2``)."""
        from tritonclient.grpc import model_config_pb2 as m

        from hloserve.bundle import dtypes

        specs: list[TensorSpec] = []
        for t in config.input:
            letters = list("acdefghijklmopqrstuvwxyz")[: len(t.dims)]
            shape = ("n" if config.max_batch_size > 0 else "") + "".join(letters)
            specs.append(
                ClientTensorSpec(
                    name=t.name,
                    dtype=dtypes.from_triton(m.DataType.Name(t.data_type)).token,
                    shape=shape,
                    dims=dict(zip(letters, (int(d) for d in t.dims), strict=True)),
                )
            )
        return cls(specs, int(config.max_batch_size))


#: What a meta knows of a callee: its wire inputs and batching.
Callee = Manifest | ForeignCallee
#: ``describe(model) -> callee``, None when unknown; raises NotFoundError when not served here.
Describe = Callable[[str], Callee | None]

#: ``send(model, inputs, output_names, timeout_us) -> outputs`` (names empty: all; 0: no
#: timeout); raises HloserveError with the callee's status.
Send = Callable[[str, Mapping[str, np.ndarray], Sequence[str], int], Mapping[str, np.ndarray]]


class Call(Protocol):
    """What ``run`` gets as ``call``: ``call(name, inputs, outputs=None) -> outputs``."""

    def __call__(
        self, name: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> Tensors: ...


#: ``run(inputs, call) -> outputs`` as defined by a meta bundle's ``model.py``.
Run = Callable[[Tensors, Call], Mapping[str, Any]]


@dataclass(eq=False)
class MetaCall:
    """The ``call`` handed to ``run``: calls ``calls`` models by ``send`` within ``deadline``.

    With ``describe``, a sub-call's inputs are checked before sending and a batch too large is
    chunked (docs/meta_models.md). ``compute_s``: seconds inside sub-calls; ``calls_made``:
    sub-requests sent.
    """

    meta: str
    calls: Sequence[str]
    send: Send
    deadline: Deadline
    _: KW_ONLY
    describe: Describe | None = None
    clock: Callable[[], float] = time.monotonic
    compute_s: float = field(default=0.0, init=False)
    calls_made: int = field(default=0, init=False)

    def __call__(
        self, name: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> Tensors:
        """Run model ``name`` on ``inputs``; its outputs (``outputs`` only, when given).

        Raises:
            InvalidArgumentError: ``name`` is not in ``meta.calls``, or ``inputs`` do not match
                the callee's or hold 0 items (nothing is sent).
            NotFoundError: the callee is not served on this worker (nothing is sent).
            DeadlineExceededError: the deadline passed before the call or a chunk, or the
                callee's timeout ran out.
            HloserveError: the callee's error, with its status, naming meta and callee.
        """
        if name not in self.calls:
            raise InvalidArgumentError(
                f"model {self.meta!r}: run called model {name!r}, which is not in its "
                f"meta.calls {list(self.calls)}"
            )
        batch, chunk = self._check_callee_inputs(name, inputs)
        if batch is None or chunk is None or batch <= chunk:
            return self._send_one(name, inputs, outputs)
        parts = [
            self._send_one(name, {k: v[i : i + chunk] for k, v in inputs.items()}, outputs)
            for i in range(0, batch, chunk)
        ]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _send_one(
        self, name: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None
    ) -> Tensors:
        self.deadline.check(self.meta, f"calling model {name!r}")
        start = self.clock()
        try:
            result = self.send(name, inputs, list(outputs or ()), self.deadline.remaining_us())
        except HloserveError as exc:
            raise _callee_error(self.meta, name, exc.message, exc.status) from None
        except Exception as exc:
            raise _callee_error(
                self.meta, name, f"{type(exc).__name__}: {exc}", Status.INTERNAL
            ) from None
        finally:
            self.compute_s += self.clock() - start
            self.calls_made += 1
        return dict(result)

    def _check_callee_inputs(
        self, name: str, inputs: Mapping[str, np.ndarray]
    ) -> tuple[int | None, int | None]:
        try:
            manifest = self.describe(name) if self.describe is not None else None
        except NotFoundError as exc:
            raise NotFoundError(
                f"model {self.meta!r}: call to model {name!r} failed: {exc.message}"
            ) from None
        if manifest is None:
            return None, None
        try:
            batch = TensorChecker(name, "input", manifest.wire_inputs)(inputs)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"model {self.meta!r}: call to model {name!r}: {exc.message}"
            ) from None
        if batch == 0:
            raise InvalidArgumentError(
                f"model {self.meta!r}: call to model {name!r}: batch size 0; a call needs at "
                "least one item"
            )
        batched = manifest.client_inputs is None and manifest.batch_leading
        return batch, manifest.max_batch_size if batched else None

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline, or None without one."""
        return self.deadline.remaining_s()


def _callee_error(meta: str, callee: str, message: str, status: Status) -> HloserveError:
    if triton_messages.unknown_model(message):
        status = Status.NOT_FOUND
    if status is Status.DEADLINE_EXCEEDED or triton_messages.timeout_expired(message):
        return DeadlineExceededError(
            f"model {meta!r}: deadline exceeded in the call to model {callee!r}: {message}"
        )
    return HloserveError(
        f"model {meta!r}: call to model {callee!r} failed: {message}", status=status
    )


def repository_describer(repository: Path) -> Describe:
    """A :data:`Describe` reading ``<repository>/<model>/1/bundle`` (or a foreign config).

    Unreadable: None (not cached); no directory in the repository: NotFoundError.
    """
    cache: dict[str, Callee] = {}

    def describe(model: str) -> Callee | None:
        if model not in cache:
            if not (repository / model).is_dir():
                raise NotFoundError(
                    f"model {model!r} is not served by this worker (not in its repository "
                    f"{repository})"
                )
            copy = repository / model / names.BUNDLE_SUBDIR
            try:
                if copy.is_dir():
                    cache[model] = load_bundle(copy, name=model).manifest
                else:  # a Triton model of another backend (docs/serving.md, "Foreign models")
                    from hloserve.model_repository_tools.config import parse_config

                    config = parse_config(repository / model / "config.pbtxt")
                    if not config.input:  # Triton auto-completes them
                        return None
                    cache[model] = ForeignCallee.from_config(config)
            except HloserveError:
                return None
        return cache[model]

    return describe


def load_run(path: Path, model: str) -> Run:
    """Import ``model.py`` at ``path`` as ``hloserve_meta_model_<model>``; its ``run``; raises
    NotFoundError: the file does not exist; InvalidArgumentError: importing it fails (the error and
    its line are named) or it defines no callable ``run``."""
    if not path.is_file():
        raise NotFoundError(f"model {model!r}: {path} does not exist; a meta bundle needs it")
    module_name = f"hloserve_meta_model_{model}".replace("-", "_").replace(".", "_")
    try:
        module = import_model_py(path, module_name)
    except ModelPyImportError as exc:
        raise InvalidArgumentError(f"model {model!r}: importing {path} failed: {exc}") from None
    run = getattr(module, "run", None)
    if not callable(run):
        raise InvalidArgumentError(f"model {model!r}: {path} defines no function run(inputs, call)")
    return run


class MetaModel:
    """Serves one meta bundle: checks a request, takes a gate permit, runs ``run``.

    ``gate`` None: no limit; a meta without ``meta.calls`` never takes a permit.
    """

    def __init__(
        self,
        name: str,
        bundle: Bundle,
        run: Run,
        send: Send,
        *,
        gate: MetaGate | None = None,
        describe: Describe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not bundle.manifest.is_meta:
            raise InvalidArgumentError(
                f"model {name!r}: bundle {bundle.path} is kind {bundle.manifest.kind!r}, not 'meta'"
            )
        self.name = name
        self.manifest = bundle.manifest
        self.calls = bundle.manifest.calls
        self._run = run
        self._send = send
        self._gate = gate if self.calls else None
        self._describe = describe
        self._clock = clock
        self._check_inputs = TensorChecker(name, "input", self.manifest.wire_inputs)
        self._check_outputs = TensorChecker(name, "output", self.manifest.wire_outputs)
        self._output_names = [s.name for s in self.manifest.wire_outputs]

    @classmethod
    def from_args(cls, args: ModelArgs, send: Send) -> MetaModel:
        """Build from the meta model's Triton config (:class:`MetaParameters`; docs/meta_models.md);
        raises InvalidArgumentError: a malformed parameter, or ``model.py`` does not import;
        NotFoundError / ManifestError: the bundle cannot be read."""
        params = MetaParameters.from_parameters(args.name, args.parameters)
        bundle = load_bundle(args.model_dir / params.bundle, name=args.name)
        run = load_run(bundle.path / MODEL_PY, args.name)
        remove_stale_gates()
        gate = MetaGate(server_gate_dir(), params.meta_concurrency)
        describe = repository_describer(args.model_dir.parent)
        return cls(args.name, bundle, run, send, gate=gate, describe=describe)

    def execute(self, inputs: Mapping[str, np.ndarray], *, timeout_us: int = 0) -> Tensors:
        """Serve one request: the ``client_outputs`` ``run`` returned (``timeout_us`` 0: none).

        Raises:
            InvalidArgumentError: the inputs do not match ``client_inputs`` or hold 0 items
                (``run`` is not called), or ``run`` called an undeclared model.
            DeadlineExceededError: the budget ran out (waiting for the gate, or before a call).
            HloserveError: a sub-call's error (its status; the message names the callee), or
                INTERNAL when ``run`` raised or returned tensors that are not the declared ones.
        """
        batch = self._check_inputs(inputs)
        if batch == 0:
            raise InvalidArgumentError(
                f"model {self.name!r}: batch size 0; a request needs at least one item"
            )
        deadline = Deadline.after_us(timeout_us, self._clock)
        if self._gate is None:
            return self._run_once(inputs, deadline)
        with self._gate.permit(self.name, deadline):
            deadline.check(self.name, "running (after waiting for the meta gate)")
            return self._run_once(inputs, deadline)

    def _run_once(self, inputs: Mapping[str, np.ndarray], deadline: Deadline) -> Tensors:
        call = MetaCall(
            self.name, self.calls, self._send, deadline, describe=self._describe, clock=self._clock
        )
        try:
            result = self._run(dict(inputs), call)
        except HloserveError:
            raise
        except Exception as exc:
            log.error("model %r: run raised:\n%s", self.name, traceback.format_exc())
            raise _internal(
                f"model {self.name!r}: run raised {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(result, Mapping):
            raise _internal(
                f"model {self.name!r}: run returned {type(result).__name__}, expected a dict "
                f"of outputs {self._output_names}"
            )
        outputs = {k: np.asarray(v) for k, v in result.items()}
        try:
            self._check_outputs(outputs)
        except InvalidArgumentError as exc:
            raise _internal(
                f"run returned outputs that do not match client_outputs: {exc.message}"
            ) from None
        return outputs


def _internal(message: str) -> HloserveError:
    return HloserveError(message, status=Status.INTERNAL)
