"""Triton backend ``hloserve_front``: a ``pb_utils`` shim over ``FrontModel`` and
``ChannelFront`` (docs/serving.md, "Front -> runtime (the channel)", Answering: ``execute``
returns the responses with ``hloserve.front_inflight`` 0, else None and response senders)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

import hloserve.jax_on_cpu  # noqa: F401  (first: JAX_PLATFORMS=cpu before any JAX import)
from hloserve.errors import HloserveError, InvalidArgumentError, Status
from hloserve.model_parameters import FrontParameters, ModelArgs
from hloserve.triton_backend import channel
from hloserve.triton_backend.backends import dlpack, pb
from hloserve.triton_backend.front.core import FrontModel
from hloserve.triton_backend.front.front_channel import ChannelFront, Request

log = logging.getLogger("hloserve.triton_backend.front")


class _Batch:
    """One ``execute`` call's requests: their responses, and a slot freed once all are in."""

    def __init__(self, count: int, slots: threading.Semaphore | None) -> None:
        self.responses: list[Any] = [None] * count
        self.done = threading.Event()
        self._left = count
        self._slots = slots
        self._lock = threading.Lock()
        if count == 0:
            self.done.set()

    def answered(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self.done.set()
            if self._slots is not None:
                self._slots.release()


class TritonPythonModel:
    """One front instance: its requests go to the runtime over the channel."""

    def initialize(self, args: dict[str, str]) -> None:
        pb.configure_logging()
        model_args = ModelArgs.from_triton(args)
        core = FrontModel.from_args(model_args)
        self._stateful = core.stateful
        params = FrontParameters.from_parameters(model_args.name, model_args.parameters)
        #: None: ``execute`` waits and returns the responses; else at most N batches in flight
        self._slots = (
            threading.Semaphore(params.front_inflight) if params.front_inflight > 0 else None
        )
        self.channel = ChannelFront(
            core,
            model_args.model_dir / params.bundle,
            self._respond,
            address=channel.address(core.runtime_model),
            wait_s=core.runtime_wait_s,
            max_request_bytes=params.max_request_bytes,
            inline=self._slots is None,
        )
        self.channel.start(wait_s=core.runtime_wait_s)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        # in flight mode, wait while this instance has its most batches unanswered: Triton's
        # dynamic batcher gathers the next batch meanwhile
        if self._slots is not None:
            self._slots.acquire()
        batch = _Batch(len(requests), self._slots)
        now = time.monotonic()
        items = []
        for i, request in enumerate(requests):
            try:
                inputs: Any = dlpack.request_inputs(request)
            except Exception as exc:  # an unreadable tensor fails this request only
                inputs = exc
            timeout_us = int(request.timeout())
            sender = request.get_response_sender() if self._slots is not None else None
            items.append(
                Request(
                    (batch, i, sender),
                    inputs,
                    now + timeout_us / 1e6 if timeout_us > 0 else None,
                    request.is_cancelled,
                    # an int or a string (the config has no CORRID tensor to hold it)
                    request.correlation_id() if self._stateful else 0,
                )
            )
        if self._slots is not None:
            self.channel.submit(items)
            return None
        self.channel.run(items)  # every request is answered: by the runtime, or failed
        if None in batch.responses:  # never: Triton would drop the request without an answer
            self._answer_missing(batch)
        return batch.responses

    def _answer_missing(self, batch: _Batch) -> None:
        """Fail INTERNAL every request of ``batch`` left without a response (a bug: Triton would
        release it unanswered)."""
        missing = [i for i, r in enumerate(batch.responses) if r is None]
        log.error(
            "model %r: %d of %d requests were left without an answer; failing them INTERNAL",
            self.channel.core.name,
            len(missing),
            len(batch.responses),
        )
        error = HloserveError(
            f"model {self.channel.core.name!r}: the request was left without an answer "
            "(an hloserve bug: please report it); retry",
            status=Status.INTERNAL,
        )
        for i in missing:
            batch.responses[i] = pb.inference_response(pb_utils, error)

    def _respond(self, handle: Any, result: Any) -> None:
        batch, index, sender = handle
        try:
            response = pb.inference_response(pb_utils, result)
            if sender is None:
                batch.responses[index] = response
            else:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            batch.answered()

    def finalize(self) -> None:
        self.channel.close()


class OverriddenFront(TritonPythonModel):
    """This front loaded as a ``python`` model (a load whose config override names no backend),
    completing the override from the generated ``config.pbtxt`` (docs/serving.md, "Model control
    mode"); the builder's ``1/model.py`` subclasses it, setting :attr:`model_file`."""

    #: the subclass's ``__file__``: ``<model directory>/1/model.py``
    model_file = ""

    @classmethod
    def auto_complete_config(cls, config: Any) -> Any:
        """``config`` (``pb_utils.ModelConfig``: the override) completed from the generated one;
        InvalidArgumentError: the generated config has ``sequence_batching`` and the override
        none, or an override's tensor disagrees with the generated one (name, dtypes or dims)."""
        override = config.as_dict()
        disk = _generated_config(Path(cls.model_file).parents[1])
        if "sequence_batching" in disk and "sequence_batching" not in override:
            raise InvalidArgumentError(
                f"model {override['name']!r}: a stateful front needs sequence_batching; the "
                "config override has none (copy it from the model's config.pbtxt)"
            )
        if not override.get("max_batch_size") and disk.get("max_batch_size"):
            config.set_max_batch_size(int(disk["max_batch_size"]))
        for key, add in (("input", config.add_input), ("output", config.add_output)):
            for tensor in disk.get(key, []):
                dims = [int(d) for d in tensor.get("dims", [])]
                # checks the override's tensor of that name, if any, against the generated one
                add({"name": tensor["name"], "data_type": tensor["data_type"], "dims": dims})
                # add() takes name, data_type and dims only; Triton keeps the whole entry
                # (reshape, label_filename, format)
                entry = next(t for t in override[key] if t["name"] == tensor["name"])
                for field, value in tensor.items():
                    entry.setdefault(field, value)
                entry["dims"] = dims
                if "reshape" in entry:
                    entry["reshape"] = {
                        "shape": [int(d) for d in entry["reshape"].get("shape", [])]
                    }
        scheduled = "sequence_batching" in override or "dynamic_batching" in override
        if "dynamic_batching" in disk and not scheduled:
            config.set_dynamic_batching()  # checks, then the generated block (queue policy)
            block = dict(disk["dynamic_batching"])
            # Triton refuses a preferred size above max_batch_size: keep those that fit an
            # override's smaller max_batch_size (the compiled sizes stay the runtime's)
            largest = int(override.get("max_batch_size") or disk.get("max_batch_size") or 0)
            preferred = [s for s in block.pop("preferred_batch_size", []) if int(s) <= largest]
            if preferred:
                block["preferred_batch_size"] = preferred
            override["dynamic_batching"] = block
        return config

    def initialize(self, args: dict[str, str]) -> None:
        """The front's ``initialize``, the generated config's ``hloserve.*`` parameters under
        the override's; InvalidArgumentError: the generated ``config.pbtxt`` is missing or bad."""
        model_config = json.loads(args["model_config"])
        generated = _generated_config(Path(args["model_repository"])).get("parameters", {})
        model_config["parameters"] = {**generated, **(model_config.get("parameters") or {})}
        super().initialize({**args, "model_config": json.dumps(model_config)})


def _generated_config(model_dir: Path) -> dict[str, Any]:
    """The generated ``config.pbtxt`` as Triton's JSON form; InvalidArgumentError naming it."""
    from google.protobuf.json_format import MessageToDict

    from hloserve.model_repository_tools.config import parse_config

    config: dict[str, Any] = MessageToDict(
        parse_config(model_dir / "config.pbtxt"), preserving_proto_field_name=True
    )
    return config
