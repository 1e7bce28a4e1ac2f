"""Run Triton's ``perf_analyzer`` (from ``tritonclient[all]``; it needs Debian's
``libb64-0d`` and ``libcudart.so.12``, even without a GPU) and read its CSV.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hloserve.errors import NotFoundError, PerfAnalyzerError


@dataclass(frozen=True)
class PerfResult:
    """One perf_analyzer measurement: inferences/s at one concurrency, client-side latency
    percentiles in microseconds."""

    concurrency: int
    throughput: float
    p50_us: float
    p90_us: float
    p99_us: float


def perf_analyzer_binary() -> Path:
    """The perf_analyzer executable beside the running Python (from tritonclient[all]); raises
    NotFoundError: not installed."""
    candidate = Path(sys.executable).parent / "perf_analyzer"
    found = candidate if candidate.exists() else shutil.which("perf_analyzer")
    if not found:
        raise NotFoundError("perf_analyzer not found: pip install 'tritonclient[all]'")
    return Path(found)


def perf_analyzer_env() -> dict[str, str]:
    """Environment with ``libcudart.so.12`` from the nvidia-cuda-runtime-cu12 wheel."""
    spec = importlib.util.find_spec("nvidia")
    roots = (spec.submodule_search_locations if spec else None) or []
    libdirs = [str(p) for r in roots if (p := Path(r) / "cuda_runtime" / "lib").is_dir()]
    inherited = [os.environ["LD_LIBRARY_PATH"]] if os.environ.get("LD_LIBRARY_PATH") else []
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libdirs + inherited)}


def run_perf_analyzer(
    model: str,
    url: str,
    *,
    protocol: str = "grpc",
    concurrency: Sequence[int] = (1,),
    shape: Sequence[str] = (),
    input_data: Path | None = None,
    measurement_interval_ms: int = 2000,
    request_count: int | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = 300.0,
) -> tuple[list[PerfResult], str]:
    """Measure ``model`` at ``url`` (``host:port``) at each concurrency level, one run each; (a
    result per level, every run's stdout). Arguments map to perf_analyzer's flags (``shape``:
    ``NAME:D1,D2`` values); ``timeout_s`` per run; raises PerfAnalyzerError: perf_analyzer failed
    (its output is in the message)."""
    results: list[PerfResult] = []
    outputs: list[str] = []
    for level in concurrency:
        with tempfile.TemporaryDirectory(prefix="hloserve-perf-") as tmp:
            report = Path(tmp) / "report.csv"
            argv = [
                str(perf_analyzer_binary()), "-m", model, "-u", url, "-i", protocol,
                "--concurrency-range", f"{level}:{level}:1",
                "--measurement-interval", str(measurement_interval_ms),
                "--percentile=99",
                # This machine is noisy: accept 50 % spread between windows (default 10 %),
                # else perf_analyzer fails with "Failed to obtain stable measurement".
                "--stability-percentage=50",
                "--max-trials=20",
                "-f", str(report),
                *(arg for s in shape for arg in ("--shape", s)),
                *(["--input-data", str(input_data)] if input_data is not None else []),
                *(["--request-count", str(request_count)] if request_count else []),
                *extra_args,
            ]  # fmt: skip
            proc = subprocess.run(
                argv, capture_output=True, text=True, env=perf_analyzer_env(), timeout=timeout_s,
                check=False,
            )  # fmt: skip
            if proc.returncode != 0 or not report.exists():
                raise PerfAnalyzerError(
                    f"perf_analyzer exited with {proc.returncode}:\n"
                    f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
                )
            with report.open() as f:
                (row,) = list(csv.DictReader(f))
        results.append(
            PerfResult(
                concurrency=int(row["Concurrency"]),
                throughput=float(row["Inferences/Second"]),
                p50_us=float(row["p50 latency"]),
                p90_us=float(row["p90 latency"]),
                p99_us=float(row["p99 latency"]),
            )
        )
        outputs.append(proc.stdout)
    return results, "\n".join(outputs)
