"""benchmarks/soak.py: its verdict on crafted samples, and a short run on a real tritonserver
(4 digits copies, weight budget at a third of their weights, 30 s in 10 s samples): zero errors,
open files and shared-memory segments flat (RSS is too noisy over seconds: not checked here)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def soak() -> Any:
    return import_benchmark("soak")


def test_the_verdict_fails_errors_leaks_and_growth(soak: Any) -> None:
    def samples(rss: list[int], fds: list[int], segments: list[int], errors: int = 0) -> Any:
        return soak.Report(
            [
                soak.Sample(i + 1.0, 100, errors if i == 1 else 0, r, f, s)
                for i, (r, f, s) in enumerate(zip(rss, fds, segments, strict=True))
            ]
        )

    flat = samples([100] * 7, [50] * 7, [4] * 7)
    assert all(flat.criteria().values()) and flat.base is flat.samples[4]
    assert flat.rss_growth == 0.0
    assert not samples([100] * 7, [50] * 7, [4] * 7, errors=1).criteria()["zero errors"]
    leaky = samples([100] * 7, [50] * 6 + [59], [4] * 6 + [5]).criteria()
    assert not leaky["open files flat"] and not leaky["segments flat"]
    assert samples([100] * 7, [50] * 6 + [58], [4] * 7).criteria()["open files flat"]  # slack 8
    # growth from minute 5: early warm-up growth is not counted, later growth is
    assert samples([10, 50, 90, 95, 100, 101, 104], [50] * 7, [4] * 7).criteria()["RSS growth < 5%"]
    assert not samples([100, 100, 100, 100, 100, 100, 106], [50] * 7, [4] * 7).criteria()[
        "RSS growth < 5%"
    ]
    short = samples([100, 104, 106], [50] * 3, [4] * 3)  # no minute 5: from the first sample
    assert short.base is short.samples[0] and not short.criteria()["RSS growth < 5%"]
    assert list(short.criteria(rss=False)) == ["zero errors", "open files flat", "segments flat"]


@pytest.mark.tritonserver
@pytest.mark.slow
def test_a_short_soak_has_no_errors_and_leaks_no_files_or_segments(soak: Any) -> None:
    out = io.StringIO()
    report = soak.soak(minutes=0.5, models=4, clients=4, interval_s=10.0, out=out)
    print(out.getvalue())
    assert len(report.samples) >= 3, out.getvalue()
    assert sum(s.requests for s in report.samples) > 0
    assert report.error_messages == [] and report.errors == 0
    met = report.criteria(rss=False)
    assert all(met.values()), (met, out.getvalue())
    assert report.samples[-1].segments == 4  # one arena per front instance, nothing left over
    assert report.weight_evictions > 0  # the budget (a third of the weights) is at work
