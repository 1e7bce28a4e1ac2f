"""The fleet-wide KServe calls' rules, once for both protocols (no I/O).

A *plan* is a generator yielding :class:`Send` steps, receiving each step's ``(worker, reply)``
list and returning the answer; :func:`drive` and :func:`drive_async` run it, a transport's
:class:`Judge` reads its replies (docs/gateway.md, "A new fleet-wide KServe call").
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

log = logging.getLogger("hloserve.gateway")

Req = TypeVar("Req")
Rep = TypeVar("Rep")
Value = TypeVar("Value")

#: Each worker's reply to one step, in the order of the step's workers.
Replies = list[tuple[str, Rep]]


@dataclass(frozen=True)
class Send(Generic[Req]):
    """One step: ``request`` sent to ``workers`` (None: all) at once (``probe``: probe timeout)."""

    request: Req
    workers: Sequence[str] | None = None
    probe: bool = False


#: A fleet-wide call: yields steps, receives their replies, returns the answer.
Plan = Generator[Send[Req], Replies[Rep], Rep]


class Judge(Protocol[Rep]):
    """What a transport says about its replies."""

    def ok(self, reply: Rep) -> bool:
        """Whether ``reply`` is a success."""
        ...

    def unavailable(self, reply: Rep) -> bool:
        """Whether ``reply`` means "try the next worker" (no connection, UNAVAILABLE)."""
        ...

    def reason(self, text: str) -> Rep:
        """A failed reply saying ``text``."""
        ...

    def failed(self, what: str, replies: Replies[Rep]) -> Rep:
        """The answer when ``what`` failed: the first refusal, else "no worker" (may raise)."""
        ...


def register(judge: Judge[Rep], what: str, request: Req, undo: Req) -> Plan[Req, Rep]:
    """Register on every worker or on none (``undo`` where accepted); the first refusal answers."""
    replies = yield Send(request)
    accepted = [w for w, r in replies if judge.ok(r)]
    if accepted and len(accepted) == len(replies):
        return replies[0][1]
    if accepted:
        for worker, reply in (yield Send(undo, accepted, probe=True)):
            if not judge.ok(reply):
                log.warning("gateway: worker %s: rolling back %s failed: %s", worker, what, reply)
    return judge.failed(what, [(w, r) for w, r in replies if not judge.ok(r)])


def unregister(judge: Judge[Rep], what: str, request: Req) -> Plan[Req, Rep]:
    """Unregister on every worker; the first success when any worker succeeds."""
    replies = yield Send(request)
    for _, reply in replies:
        if judge.ok(reply):
            return reply
    return judge.failed(what, replies)


def merged(
    judge: Judge[Rep],
    what: str,
    request: Req,
    parse: Callable[[Rep], Value],
    merge: Callable[[list[Value]], Rep],
    probe: bool = False,
) -> Plan[Req, Rep]:
    """Every worker's successful reply parsed and merged; the first failure when none is left."""
    replies = yield Send(request, probe=probe)
    values: list[Value] = []
    failed: Replies[Rep] = []
    for worker, reply in replies:
        if not judge.ok(reply):
            failed.append((worker, reply))
            continue
        try:
            values.append(parse(reply))
        except ValueError as exc:
            log.warning("gateway: worker %s: %s: %s", worker, what, exc)
            failed.append((worker, judge.reason(str(exc))))
    return merge(values) if values else judge.failed(what, failed)


def first_answer(
    judge: Judge[Rep], what: str, request: Req, workers: Sequence[str]
) -> Plan[Req, Rep]:
    """``workers`` one after another until one answers other than "unavailable"."""
    replies: Replies[Rep] = []
    for worker in workers:
        reply = (yield Send(request, (worker,)))[0]
        if not judge.unavailable(reply[1]):
            return reply[1]
        replies.append(reply)
    return judge.failed(what, replies)


def decided(judge: Judge[Rep], what: str, answers: Replies[Rep]) -> Rep:
    """Model control's answer: the first refusal, else the first worker's success."""
    refused = [(w, r) for w, r in answers if not judge.ok(r)]
    return judge.failed(what, refused) if refused or not answers else answers[0][1]


def drive(plan: Plan[Req, Rep], fan_out: Callable[[Send[Req]], Replies[Rep]]) -> Rep:
    """Run ``plan`` with a blocking ``fan_out``."""
    try:
        step = next(plan)
        while True:
            step = plan.send(fan_out(step))
    except StopIteration as done:
        return cast(Rep, done.value)


async def drive_async(
    plan: Plan[Req, Rep], fan_out: Callable[[Send[Req]], Awaitable[Replies[Rep]]]
) -> Rep:
    """Run ``plan`` with an asyncio ``fan_out``."""
    try:
        step = next(plan)
        while True:
            step = plan.send(await fan_out(step))
    except StopIteration as done:
        return cast(Rep, done.value)
