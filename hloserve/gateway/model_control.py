"""Explicit model control through the gateway: which workers a load or an unload goes to.

One decision for both protocols (docs/gateway.md, "Model control"): the gRPC and KServe HTTP
servers call :meth:`ModelControl.run` with a :data:`Send` carrying one step in their protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

import grpc

from hloserve.errors import FailedPreconditionError, HloserveError, Status
from hloserve.gateway.discovery import SingleFlight, group_calls
from hloserve.gateway.routing import Router
from hloserve.gateway.upstreams import Upstreams
from hloserve.names import RUNTIME_MODEL

log = logging.getLogger("hloserve.gateway")

Action = Literal["load", "unload"]

#: A worker's answer in the caller's protocol (gRPC reply bytes or error; an HTTP answer).
R = TypeVar("R")

#: Carries one step: ``(action, model, workers)`` -> ``(worker, answer)`` per worker (the
#: client's own request for its model; a plain one with its key for the others).
Send = Callable[[Action, str, Sequence[str]], Awaitable[list[tuple[str, R]]]]

#: Where a model no worker holds goes: ``(model, callees, candidates)`` -> some candidates.
Place = Callable[[str, Sequence[str], Sequence[str]], Sequence[str]]

#: Triton's index reason (state UNAVAILABLE) of a model unloaded on request.
UNLOADED_REASON = "unloaded"

#: Prefix of a load parameter overriding a file of the model's directory (Triton).
FILE_OVERRIDE_PREFIX = "file:"
#: Most bytes of one path component (Linux ``NAME_MAX``); a longer one stops tritonserver.
NAME_MAX = 255
#: Most bytes of a whole path (Linux ``PATH_MAX``).
PATH_MAX = 4096


def check_file_overrides(model: str, parameters: Collection[str]) -> None:
    """Refuse a load whose ``file:<path>`` parameter names a path tritonserver cannot create.

    Raises:
        HloserveError: INTERNAL, "failed to load 'm', failed to poll from model repository..."
            (tritonserver's text) for a component over :data:`NAME_MAX` or a path over
            :data:`PATH_MAX` bytes (UTF-8); names the model, the parameter and the limit.
    """
    for name in parameters:
        if not name.startswith(FILE_OVERRIDE_PREFIX):
            continue
        path = name[len(FILE_OVERRIDE_PREFIX) :]
        shown = name if len(name) <= 64 else f"{name[:64]}..."
        size = len(path.encode("utf-8", "surrogatepass"))
        longest = max((len(c.encode("utf-8", "surrogatepass")) for c in path.split("/")), default=0)
        if longest > NAME_MAX:
            what = f"a path component of {longest} bytes, over the limit of {NAME_MAX} bytes"
        elif size > PATH_MAX:
            what = f"a path of {size} bytes, over the limit of {PATH_MAX} bytes"
        else:
            continue
        raise HloserveError(
            f"failed to load {model!r}, failed to poll from model repository: parameter "
            f"{shown!r} names {what} (tritonserver cannot create such a file: at most "
            f"{NAME_MAX} bytes per path component and {PATH_MAX} bytes per path); the load was "
            "sent to no worker",
            status=Status.INTERNAL,
        )


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """``(worker, answer)`` of the step deciding the client's answer; ``failed``: one refused."""

    answers: list[tuple[str, R]]
    failed: bool


@dataclass(eq=False)
class ModelControl:
    """The model-control decision, on the gateway's event loop; ``refresh`` runs after the steps,
    ``place`` picks a new model's workers (None: every candidate).
    """

    router: Router
    upstreams: Upstreams
    probe_timeout_s: float
    refresh: Callable[[], Awaitable[None]] | None = None
    place: Place | None = None
    _calls: dict[str, tuple[str, ...]] = field(default_factory=dict, init=False, repr=False)

    async def indexes(self) -> dict[str, dict[str, str]]:
        """worker -> {model: state} of the workers answering (``"unloaded"``: on request)."""

        async def index(worker: str) -> dict[str, str] | None:
            try:
                models = await self.upstreams.repository_index(worker, self.probe_timeout_s)
            except grpc.aio.AioRpcError:
                return None
            return {
                m.name: UNLOADED_REASON
                if m.state == "UNAVAILABLE" and m.reason == UNLOADED_REASON
                else m.state
                for m in models
            }

        found = await asyncio.gather(*(index(w) for w in self.upstreams.workers))
        return {w: i for w, i in zip(self.upstreams.workers, found, strict=True) if i is not None}

    async def meta_calls(self, model: str, worker: str) -> tuple[str, ...] | None:
        """``model``'s callees (:func:`group_calls`) on ``worker``; None: config unreadable."""
        try:
            return group_calls(
                await self.upstreams.model_config(worker, model, self.probe_timeout_s)
            )
        except grpc.aio.AioRpcError:
            return None

    def known_calls(self, model: str) -> tuple[str, ...] | None:
        """A meta's callees as the routing table or an earlier load saw them; None: unknown."""
        route = self.router.table.get(model)
        if route is not None and route.calls:
            self._calls[model] = route.calls
        return self._calls.get(model)

    def _placed(
        self, model: str, calls: Sequence[str], indexes: Mapping[str, Mapping[str, str]]
    ) -> list[str]:
        names = (model, *calls)
        candidates = [w for w, i in indexes.items() if all(n in i for n in names)]
        candidates = candidates or [w for w, i in indexes.items() if model in i]
        candidates = candidates or list(self.upstreams.workers)
        if self.place is None:
            return candidates
        return list(self.place(model, calls, candidates)) or candidates

    async def run(
        self,
        action: Action,
        model: str,
        send: Send[R],
        ok: Callable[[R], bool],
        parameters: Collection[str] = (),
    ) -> Outcome[R]:
        """Load or unload ``model`` (``parameters``: the load's parameter names).

        Raises:
            FailedPreconditionError: an unload of :data:`hloserve.names.RUNTIME_MODEL`.
            HloserveError: a bad ``file:`` override (:func:`check_file_overrides`).
        """
        if action == "unload" and model == RUNTIME_MODEL:
            raise FailedPreconditionError(
                f"model {model!r} is hloserve's runtime: every bundle model of a worker runs "
                "in it, so the gateway does not unload it; unload the bundle models instead"
            )
        if action == "load":
            check_file_overrides(model, parameters)
        try:
            return await self._run(action, model, send, ok)
        finally:
            with contextlib.suppress(Exception):  # the next poll tries again
                if isinstance(self.refresh, SingleFlight):  # now, not within its interval
                    await self.refresh(force=True)
                elif self.refresh is not None:
                    await self.refresh()

    async def _run(
        self, action: Action, model: str, send: Send[R], ok: Callable[[R], bool]
    ) -> Outcome[R]:
        async def step(name: str, workers: Sequence[str], how: Action = "load") -> Outcome[R]:
            answers = await send(how, name, workers) if workers else []
            return Outcome(answers, not all(ok(a) for _, a in answers))

        indexes = await self.indexes()
        # the workers holding it: listed in a state but not unloaded
        held = [w for w, i in indexes.items() if i.get(model, "") not in ("", UNLOADED_REASON)]
        if held or action == "unload":
            return await step(model, held or list(self.upstreams.workers), action)
        calls = self.known_calls(model)
        if calls:
            return await self._load_group(model, calls, indexes, None, step)
        first = await step(model, self._placed(model, (), indexes))
        if first.failed or not first.answers:
            return first
        calls = await self.meta_calls(model, first.answers[0][0])
        if not calls:
            return first
        self._calls[model] = tuple(calls)
        log.info("gateway: %r is a meta calling %s: placing it with them", model, list(calls))
        return await self._load_group(model, calls, await self.indexes(), first, step)

    async def _load_group(
        self,
        model: str,
        calls: Sequence[str],
        indexes: Mapping[str, Mapping[str, str]],
        first: Outcome[R] | None,
        step: Callable[..., Awaitable[Outcome[R]]],
    ) -> Outcome[R]:
        """Load meta ``model``'s group (callees first); unload it where ``first`` put it outside."""
        loaded = [w for w, _ in first.answers] if first is not None else []
        whole = [
            w for w, i in indexes.items() if model in i and all(i.get(c) == "READY" for c in calls)
        ]
        targets = whole or self._placed(model, calls, indexes)
        log.info("gateway: meta %r goes to %s with %s", model, ", ".join(targets), list(calls))
        for callee in calls:
            missing = [w for w in targets if indexes.get(w, {}).get(callee) != "READY"]
            outcome = await step(callee, missing)
            if outcome.failed:
                return outcome
        outcome = await step(model, [w for w in targets if w not in loaded])
        if outcome.failed:
            return outcome
        extra = [w for w in loaded if w not in targets]
        if extra:
            undone = await step(model, extra, "unload")
            if undone.failed:
                log.warning("gateway: meta %r stays loaded on %s: %s", model, extra, undone.answers)
        return first if first is not None and not outcome.answers else outcome
