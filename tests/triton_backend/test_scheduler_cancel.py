"""``Scheduler.cancel``: queued works whose clients gave up are shed (issue 28, deadlines).

Pure logic with an injected clock, as tests/triton_backend/test_scheduler.py.
"""

from __future__ import annotations

import pytest

from hloserve.triton_backend.runtime.scheduler import REASON_CANCELLED
from tests.triton_backend.test_scheduler import make, put, take


@pytest.mark.parametrize("discipline", ["fair", "fifo", "edf"])
def test_cancelled_works_are_shed_and_the_others_run(discipline: str) -> None:
    s, clock, shed = make(discipline)
    s.register("a", 0, [1, 4])
    s.register("b", 0, [1])
    gone = [put(s, clock, "a"), put(s, clock, "b")]
    kept = put(s, clock, "a")
    assert s.cancel(lambda w: w in gone) == 2
    assert shed == [(gone[0], REASON_CANCELLED), (gone[1], REASON_CANCELLED)]
    assert s.snapshot().shed == 2
    assert take(s).works == (kept,)
    assert s.next(timeout=0) is None
    assert s.cancel(lambda w: True) == 0  # nothing queued: nothing to shed
