"""benchmarks/gpu_weight_cache.py (a GPU check): its verdict on failing numbers, and an end to
end run on CPU with a small size (where the ratio and memory goals are not checked)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import import_benchmark

SMALL = ["--bytes", "1MiB", "--tensors", "2", "--repeats", "2", "--platform", "cpu"]


@pytest.fixture(scope="module")
def script() -> Any:
    return import_benchmark("gpu_weight_cache")


def test_gpu_weight_cache_script_runs_on_cpu(
    script: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main([*SMALL, "--check"]) == 0
    out = capsys.readouterr().out
    assert "model 1.0 MiB in 2 array(s)" in out
    assert "(a) cache cold load" in out and "ratio c/b" in out and "PASS" in out
    assert "no pinned tier here: goal not checked" in out
    assert "no memory_stats on this device (CPU); not checked" in out
    assert script.parse_bytes("1GiB") == 2**30 and script.parse_bytes("4096") == 4096


def test_verdict_fails_a_slow_cache_or_memory_not_given_back(script: Any) -> None:
    verdict = script.verdict
    assert script.RATIO_GOAL == 1.2
    assert verdict(1.2, pinned_tier=True, memory_back=True)
    assert not verdict(1.21, pinned_tier=True, memory_back=True)  # the cache too slow
    assert not verdict(1.0, pinned_tier=True, memory_back=False)  # eviction leaked
    assert not verdict(3.0, pinned_tier=True, memory_back=None)  # no statistics: ratio still
    assert verdict(3.0, pinned_tier=False, memory_back=None)  # CPU: neither goal checked
    assert not verdict(1.0, pinned_tier=False, memory_back=False)
    mib, gib = 2**20, 2**30
    assert script.back_to_pre_load(5 * gib, 5 * gib + mib, gib)  # within 1 MiB
    assert script.back_to_pre_load(5 * gib, 5 * gib + gib // 1000, gib)  # within 0.1%
    assert not script.back_to_pre_load(5 * gib, 5 * gib + gib // 1000 + 1, gib)
    assert not script.back_to_pre_load(5 * gib, 5 * gib - 2 * mib, 10 * mib)  # below it too


def test_check_exits_1_when_the_verdict_fails(
    script: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[float, bool, bool | None]] = []

    def failing(ratio: float, *, pinned_tier: bool, memory_back: bool | None) -> bool:
        seen.append((ratio, pinned_tier, memory_back))
        return False

    monkeypatch.setattr(script, "verdict", failing)
    assert script.main([*SMALL, "--check"]) == 1
    assert "MISSED a goal" in capsys.readouterr().out
    assert script.main(SMALL) == 0  # without --check the verdict is printed only
    ratio, pinned_tier, memory_back = seen[0]
    assert ratio > 0 and pinned_tier is False and memory_back is None  # CPU
