"""The fleet-wide calls' rules (hloserve.gateway.fleet_ops), driven by a scripted fan-out.

A reply is an int: 2xx succeeds, 503 means "try the next worker", anything else refuses. The
transports' own tests drive the same plans over real sockets: tests/gateway/test_proxy.py
(gRPC), tests/gateway/test_http_fleet.py and test_http_tritonserver.py (KServe HTTP)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hloserve.gateway import fleet_ops

WORKERS = ("w0", "w1", "w2")


class IntJudge:
    def ok(self, reply: int) -> bool:
        return 200 <= reply < 300

    def unavailable(self, reply: int) -> bool:
        return reply == 503

    def reason(self, text: str) -> int:
        return 502

    def failed(self, what: str, replies: fleet_ops.Replies[int]) -> int:
        return next((r for _, r in replies), 503)


class Fleet:
    """Answers each (request, worker) from ``script`` (default 200); records the steps."""

    def __init__(self, script: dict[tuple[str, str], int]) -> None:
        self.script = script
        self.steps: list[tuple[str, tuple[str, ...], bool]] = []

    def __call__(self, step: fleet_ops.Send[str]) -> fleet_ops.Replies[int]:
        workers = WORKERS if step.workers is None else tuple(step.workers)
        self.steps.append((step.request, workers, step.probe))
        return [(w, self.script.get((step.request, w), 200)) for w in workers]


JUDGE = IntJudge()


def test_register_everywhere_answers_the_first_success() -> None:
    fleet = Fleet({("reg", "w0"): 201})
    assert fleet_ops.drive(fleet_ops.register(JUDGE, "r", "reg", "undo"), fleet) == 201
    assert fleet.steps == [("reg", WORKERS, False)]


def test_a_refused_register_is_undone_where_it_was_accepted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = Fleet({("reg", "w1"): 400, ("undo", "w2"): 500})
    with caplog.at_level(logging.WARNING, "hloserve.gateway"):
        assert fleet_ops.drive(fleet_ops.register(JUDGE, "r", "reg", "undo"), fleet) == 400
    assert fleet.steps == [("reg", WORKERS, False), ("undo", ("w0", "w2"), True)]
    assert "worker w2: rolling back r failed: 500" in caplog.text


def test_unregister_succeeds_when_any_worker_does() -> None:
    fleet = Fleet({("un", "w0"): 404, ("un", "w2"): 404})
    assert fleet_ops.drive(fleet_ops.unregister(JUDGE, "u", "un"), fleet) == 200
    nobody = Fleet({("un", w): 404 for w in WORKERS})
    assert fleet_ops.drive(fleet_ops.unregister(JUDGE, "u", "un"), nobody) == 404


def test_merged_leaves_out_failures_and_replies_that_do_not_parse() -> None:
    def parse(reply: int) -> int:
        if reply == 299:
            raise ValueError("not an index")
        return reply

    def total(values: list[int]) -> int:
        return sum(values)

    fleet = Fleet({("ix", "w0"): 404, ("ix", "w1"): 299, ("ix", "w2"): 201})
    plan = fleet_ops.merged(JUDGE, "index", "ix", parse, total, probe=True)
    assert fleet_ops.drive(plan, fleet) == 201
    assert fleet.steps == [("ix", WORKERS, True)]
    garbage = Fleet({("ix", w): 299 for w in WORKERS})
    assert fleet_ops.drive(fleet_ops.merged(JUDGE, "index", "ix", parse, total), garbage) == 502


def test_first_answer_moves_on_only_when_unavailable() -> None:
    fleet = Fleet({("md", "w0"): 503, ("md", "w1"): 404})
    assert fleet_ops.drive(fleet_ops.first_answer(JUDGE, "m", "md", WORKERS), fleet) == 404
    assert [s[1] for s in fleet.steps] == [("w0",), ("w1",)]
    down = Fleet({("md", w): 503 for w in WORKERS})
    assert fleet_ops.drive(fleet_ops.first_answer(JUDGE, "m", "md", WORKERS), down) == 503


def test_the_async_driver_runs_the_same_plan() -> None:
    fleet = Fleet({("reg", "w2"): 400})

    async def fan_out(step: fleet_ops.Send[str]) -> fleet_ops.Replies[int]:
        await asyncio.sleep(0)
        return fleet(step)

    plan = fleet_ops.register(JUDGE, "r", "reg", "undo")
    assert asyncio.run(asyncio.wait_for(fleet_ops.drive_async(plan, fan_out), 10)) == 400
    assert fleet.steps[-1] == ("undo", ("w0", "w1"), True)


def test_model_control_answers_the_first_refusal_else_the_first_success() -> None:
    assert fleet_ops.decided(JUDGE, "load", [("w0", 200), ("w1", 400), ("w2", 404)]) == 400
    assert fleet_ops.decided(JUDGE, "load", [("w0", 201), ("w1", 200)]) == 201
    assert fleet_ops.decided(JUDGE, "load", []) == 503
