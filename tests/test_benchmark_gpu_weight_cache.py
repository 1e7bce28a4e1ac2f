"""benchmarks/gpu_weight_cache.py (a GPU check) runs end to end on CPU with a small size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_weight_cache.py"


def test_gpu_weight_cache_script_runs_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("gpu_weight_cache", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--bytes", "1MiB", "--tensors", "2", "--repeats", "2", "--platform", "cpu"]
    assert module.main([*argv, "--check"]) == 0
    out = capsys.readouterr().out
    assert "model 1.0 MiB in 2 array(s)" in out
    assert "(a) cache cold load" in out and "ratio c/b" in out and "PASS" in out
    assert module.parse_bytes("1GiB") == 2**30 and module.parse_bytes("4096") == 4096
