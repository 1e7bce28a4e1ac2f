"""Triton backend ``hloserve_front``: a shim over the typed cores ``FrontModel`` and
``ChannelFront``.

Adapts ``pb_utils`` objects only; the behaviour lives in the typed cores. ``execute`` hands the
requests to the runtime over the channel and returns ``None``: each request is answered later,
through its response sender, from the channel's reader thread (allowed for a non-decoupled
model in Triton 2.51), so one instance keeps many requests in flight.
"""

from __future__ import annotations

import json
import time
from typing import Any

import triton_python_backend_utils as pb_utils

from hloserve.errors import InvalidArgumentError
from hloserve.model_repository_tools import names
from hloserve.triton_backend import channel, pb
from hloserve.triton_backend.front import FrontModel
from hloserve.triton_backend.front_channel import ChannelFront, Request


def _tags_errors(request: Any) -> bool:
    """Whether the request (a meta model's BLS sub-request) asks for status-tagged errors."""
    try:
        params = json.loads(request.parameters() or "{}")
    except (TypeError, ValueError):
        return False
    return bool(params.get(names.REQUEST_PARAM_TAG_ERRORS))


def _no_bls(*_: Any) -> Any:
    raise AssertionError("the channel front never calls the runtime through FrontModel.execute")


class TritonPythonModel:
    """One front instance: its requests go to the runtime over the channel."""

    def initialize(self, args: dict[str, str]) -> None:
        pb.configure_logging()
        model_args = pb.ModelArgs.from_triton(args)
        core = FrontModel.from_args(model_args, _no_bls)
        limit = model_args.parameter(
            names.PARAM_MAX_REQUEST_BYTES, str(names.DEFAULT_MAX_REQUEST_BYTES)
        )
        if not limit.isdigit() or int(limit) < 1:
            raise InvalidArgumentError(
                f"model {core.name!r}: parameter {names.PARAM_MAX_REQUEST_BYTES!r} must be a "
                f"positive integer, got {limit!r}"
            )
        self.channel = ChannelFront(
            core,
            model_args.model_dir / model_args.parameter(names.PARAM_BUNDLE),
            self._respond,
            address=channel.address(core.runtime_model),
            wait_s=core.retry.total_s,
            max_request_bytes=int(limit),
        )
        self.channel.start(wait_s=core.retry.total_s)

    def execute(self, requests: list[Any]) -> None:
        now = time.monotonic()
        items = []
        for request in requests:
            try:
                inputs: Any = pb.request_inputs(request)
            except Exception as exc:  # an unreadable tensor fails this request only
                inputs = exc
            timeout_us = int(request.timeout())
            items.append(
                Request(
                    (request.get_response_sender(), _tags_errors(request)),
                    inputs,
                    now + timeout_us / 1e6 if timeout_us > 0 else None,
                )
            )
        self.channel.submit(items)
        return None

    def _respond(self, handle: Any, result: Any) -> None:
        sender, tagged = handle
        sender.send(
            pb.inference_response(pb_utils, result, tagged=tagged),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def finalize(self) -> None:
        self.channel.close()
