"""A meta's sub-calls to bundle models over the runtime's channel, from the meta's own process.

Each bundle callee gets a :class:`~hloserve.triton_backend.front.core.FrontModel` and an inline,
committed :class:`~hloserve.triton_backend.front.front_channel.ChannelFront` here (no BLS round
trip); foreign callees go to the ``foreign`` transport (docs/meta_models.md, "On a worker").
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hloserve import names
from hloserve.errors import HloserveError, InvalidArgumentError, NotFoundError, Status
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend import channel
from hloserve.triton_backend.front.core import FrontModel
from hloserve.triton_backend.front.front_channel import ChannelFront, Request

if TYPE_CHECKING:
    from hloserve.meta.core import Send

log = logging.getLogger("hloserve.meta")


class _Callee:
    """One callee's front in this process; sub-calls to it take turns (inline reads)."""

    def __init__(self, args: ModelArgs, key: str | None) -> None:
        core = FrontModel.from_args(args)
        self.wait_s = core.runtime_wait_s
        self.lock = threading.Lock()
        self.front = ChannelFront(
            core,
            core.bundle.path,
            list.append,  # the request's handle is the list its answer goes to
            address=channel.address(core.runtime_model, key),
            wait_s=core.runtime_wait_s,
            key=key,
            inline=True,
            committed=True,
        )
        self.front.start()  # connects and loads in the background


def _out_of_time(result: Any, deadline: float | None) -> bool:
    """Whether ``result`` ran out of time unexecuted: UNAVAILABLE naming the deadline (shed by
    the scheduler) or once the deadline has passed."""
    return (
        deadline is not None
        and isinstance(result, HloserveError)
        and result.status is Status.UNAVAILABLE
        and ("deadline" in result.message or time.monotonic() >= deadline)
    )


def front_args(repository: Path, model: str) -> ModelArgs | None:
    """The ``initialize`` args of ``model``'s front in ``repository``; None when not a bundle;
    raises InvalidArgumentError: the config does not parse."""
    path = repository / model / "config.pbtxt"
    if not path.is_file():
        return None
    from hloserve.model_repository_tools.config import parse_config

    config = parse_config(path)
    if config.backend != names.FRONT_BACKEND:
        return None
    parameters = {k: {"string_value": v.string_value} for k, v in config.parameters.items()}
    return ModelArgs(
        name=model,
        model_dir=repository / model,
        version=names.MODEL_VERSION,
        config={"parameters": parameters},
    )


class ChannelCalls:
    """The bundle callees of one meta instance, each reached over the channel.

    ``foreign``: the transport to other callees (None: refused NOT_FOUND); ``sent``: callee ->
    sub-calls since :meth:`take_sent`.

    Raises:
        HloserveError: a callee's config or bundle copy cannot be read (its front would not
            load either).
    """

    def __init__(
        self,
        repository: Path,
        calls: Sequence[str],
        *,
        foreign: Send | None = None,
        key: str | None = None,
    ) -> None:
        self._callees: dict[str, _Callee] = {}
        self._foreign = foreign
        self.sent: collections.Counter[str] = collections.Counter()
        try:
            for model in calls:
                args = front_args(repository, model)
                if args is not None:
                    self._callees[model] = _Callee(args, key)
        except BaseException:
            self.close()
            raise

    def serves(self, model: str) -> bool:
        """Whether sub-calls to ``model`` go over the channel (it is a bundle)."""
        return model in self._callees

    def send(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], timeout_us: int
    ) -> dict[str, np.ndarray]:
        """One sub-call (:data:`hloserve.meta.core.Send`) over the channel, else ``foreign``.

        Raises:
            NotFoundError: no bundle callee and no ``foreign`` transport.
            InvalidArgumentError: ``outputs`` names an output the callee does not have.
            HloserveError: the callee's error with its status; DEADLINE_EXCEEDED when it ran
                out of time unexecuted.
        """
        callee = self._callees.get(model)
        if callee is None:
            if self._foreign is None:
                raise NotFoundError(f"model {model!r} is not a bundle of this repository")
            return dict(self._foreign(model, inputs, outputs, timeout_us))
        self.sent[model] += 1
        deadline = time.monotonic() + timeout_us / 1e6 if timeout_us > 0 else None
        answer: list[Any] = []
        with callee.lock:  # one run at a time: wait_s is this call's
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            callee.front.wait_s = callee.wait_s if left is None else min(callee.wait_s, left)
            callee.front.run([Request(answer, inputs, deadline)])
        [result] = answer
        if _out_of_time(result, deadline):  # never executed
            raise HloserveError(str(result), status=Status.DEADLINE_EXCEEDED)
        if isinstance(result, Exception):
            raise result
        unknown = [n for n in outputs if n not in result]
        if unknown:
            raise InvalidArgumentError(
                f"model {model!r}: unknown output {unknown[0]!r}; outputs are {sorted(result)}"
            )
        return {n: result[n] for n in outputs} if outputs else dict(result)

    def take_sent(self) -> dict[str, int]:
        """:attr:`sent`, then zeroed."""
        sent, self.sent = dict(self.sent), collections.Counter()
        return sent

    def close(self) -> None:
        """Disconnect every callee's front (the runtime releases its holds)."""
        for callee in self._callees.values():
            callee.front.close()
        self._callees.clear()
