"""benchmarks/plot_weight_cache.py: its rates and hit ratio, and the docs' picture rendered
again from the benchmark output checked in beside it (docs/images/weight_cache.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import import_benchmark

ROOT = Path(__file__).resolve().parents[2]
TIMELINE = ROOT / "docs" / "images" / "weight_cache.json"

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def plot() -> Any:
    return import_benchmark("plot_weight_cache")


def _sample(t: float, loads: float, executions: float) -> dict[str, Any]:
    return {"t": t, "hloserve_weight_loads_total": loads, "hloserve_executions_total": executions}


def test_rate_is_the_increase_over_the_trailing_window(plot: Any) -> None:
    samples = [_sample(t, 10.0 * t, 0.0) for t in (0.0, 1.0, 2.0, 3.0)]
    assert plot.rate(samples, "hloserve_weight_loads_total", 2.0) == [0.0, 10.0, 10.0, 10.0]


def test_hit_ratio_is_read_where_the_executions_counter_moved(plot: Any) -> None:
    """Executions are published once a second: samples between two publications are skipped,
    or the ratio would swing with the unpublished second."""
    samples = [
        _sample(0.0, 0.0, 0.0),
        _sample(0.5, 5.0, 0.0),  # loads counted, executions not yet published
        _sample(1.0, 10.0, 40.0),
        _sample(1.5, 15.0, 40.0),
        _sample(2.0, 20.0, 80.0),
    ]
    times, ratio = plot.hit_ratio(samples, 4.0)
    assert times == [1.0, 2.0] and ratio == [0.75, 0.75]


def test_the_docs_picture_renders_from_the_checked_in_benchmark_output(
    plot: Any, tmp_path: Path
) -> None:
    data = json.loads(TIMELINE.read_text())
    assert data["settings"]["over"] == 3.0 and len(data["runs"]) == 2
    out = tmp_path / "weight_cache.png"
    assert plot.main([str(TIMELINE), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
