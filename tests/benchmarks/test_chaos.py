"""benchmarks/chaos.py, short (issue 28 item 5): one ``hloserve serve`` on a real tritonserver
with a gateway in front; overload for a few seconds on each target, then a front stub, the
runtime stub, the tritonserver and the gateway's HAProxy each SIGKILLed once under load; a
model with two replicas (two workers) through a tritonserver kill; a short soak. The
long versions (60 s of overload, the kill matrix) are the benchmark's defaults; figures in
benchmarks/RESULTS.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import import_benchmark

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def chaos() -> Any:
    return import_benchmark("chaos")


@pytest.fixture(scope="module")
def rig(chaos: Any) -> Iterator[Any]:
    with chaos.rig() as r:
        yield r


def test_the_verdict_counts_refusals_and_names_failed_checks(chaos: Any) -> None:
    case = chaos.Case("overload direct")
    full = "[request id: <id_unknown>] Exceeds maximum queue size"
    case.outcomes = [
        chaos.Outcome("direct", 0.0, 0.01, "OK"),
        chaos.Outcome("direct", 0.0, 0.01, "StatusCode.UNAVAILABLE", full),
        chaos.Outcome("direct", 0.0, 0.01, "StatusCode.UNAVAILABLE", "connection refused"),
    ]
    assert case.counts() == {"OK": 1, "queue full": 1, "StatusCode.UNAVAILABLE": 1}
    case.checks = {"a": True, "b": False}
    assert not case.passed and "  [FAILED] b" in case.lines()


@pytest.mark.parametrize("target", ["direct", "gateway"])
def test_overload_refuses_with_queue_full_and_answers_the_rest(
    chaos: Any, rig: Any, target: str
) -> None:
    case = chaos.overload(rig, target, seconds=3.0, measure_s=2.0)
    print("\n".join(case.lines()))
    assert case.passed, "\n".join(case.lines())


@pytest.mark.parametrize("kind", ["front", "runtime", "tritonserver", "haproxy"])
def test_a_kill_fails_fast_and_recovers(chaos: Any, rig: Any, kind: str) -> None:
    case = chaos.kill(rig, kind)
    print("\n".join(case.lines()))
    assert case.passed, "\n".join(case.lines()) + "\n" + rig.tail()


def test_a_model_with_two_replicas_never_fails_a_new_request(chaos: Any) -> None:
    """Two workers serve ``slow``; one's tritonserver is SIGKILLed under load through the
    gateway: every request sent after the kill is answered by the other (HAProxy's ``retry-on
    conn-failure`` with ``option redispatch``, hloserve/gateway/dataplane.py), those in flight
    fail UNAVAILABLE at once or are answered."""
    with chaos.rig(workers=2) as r:
        case = chaos.two_replicas(r)
        print("\n".join(case.lines()))
        assert case.passed, "\n".join(case.lines()) + "\n" + r.tail()


def test_the_soak_reloads_the_watched_bundle_with_no_failed_request(chaos: Any) -> None:
    """--watch reloads ``watched`` twice while clients run through the gateway: none fails."""
    with chaos.rig(watch_s=1.0) as r:
        case = chaos.soak(r, seconds=20.0, reload_s=6.0, sample_s=5.0, growth_limit=0.5)
        print("\n".join(case.lines()))
        assert case.passed, "\n".join(case.lines()) + "\n" + r.tail()
