"""Soak: many models under a tight weight budget and mixed load; does anything leak?

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--models 20] [--clients 8]

One tritonserver serves ``--models`` copies of digits (examples/digits/export.py) with the
runtime's weight cache budget (``--weight-cache-bytes``, docs/on_demand_weights.md) at a third
of their total weights, so models keep being evicted and loaded again. ``--clients``
closed-loop clients (every fourth over HTTP, the others over gRPC) send requests of 1 to 8
rows to a model chosen at random, until the end (each at most ``--max-requests``).

Every ``--interval`` seconds (a minute) it prints the requests and errors of that interval, the
server's total RSS (tritonserver and every Python backend stub, from ``/proc/<pid>/smaps_rollup``),
its open file descriptors (``/proc/<pid>/fd`` of the same processes) and its shared-memory
segments (``/dev/shm/hloserve.*`` carrying the server's pid). At the end it checks:

* zero errors;
* RSS growth below ``--rss-growth`` (5%) from the sample at minute 5 (the first sample when
  the run has no later one) to the last;
* open files flat (the last sample at most ``--fd-slack`` above that base sample) and
  segments flat (the same count);

and exits 1 when one fails. A machine shared with other work makes RSS noisy over minutes.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from many_models import (  # noqa: E402
    export_digits_copies,
    memory,
    metric_total,
    process_memory,
)

MIB = 1024 * 1024
#: Sample index of "minute 5" (the base of the growth checks), when the run has a later one.
BASE_SAMPLE = 4
#: Rows per request: 1 to this (digits compiles batch sizes 1, 8 and 32).
MAX_ROWS = 8


@dataclass(frozen=True)
class Sample:
    """One interval: its requests and errors, and the server's state at its end."""

    minute: float
    requests: int
    errors: int
    rss: int
    fds: int
    segments: int


@dataclass
class Report:
    """A soak run: its samples, the first error messages, and the verdict of each criterion."""

    samples: list[Sample]
    error_messages: list[str] = field(default_factory=list)
    #: weight loads and evictions of the runtime's cache over the run (the budget at work)
    weight_loads: int = 0
    weight_evictions: int = 0
    rss_growth_limit: float = 0.05
    fd_slack: int = 8

    @property
    def base(self) -> Sample:
        return self.samples[BASE_SAMPLE if len(self.samples) > BASE_SAMPLE + 1 else 0]

    @property
    def errors(self) -> int:
        return sum(s.errors for s in self.samples)

    @property
    def rss_growth(self) -> float:
        return (self.samples[-1].rss - self.base.rss) / max(self.base.rss, 1)

    def criteria(self, *, rss: bool = True) -> dict[str, bool]:
        """Each criterion by name: True when met (``rss=False`` leaves the RSS one out)."""
        last = self.samples[-1]
        met = {
            "zero errors": self.errors == 0,
            "open files flat": last.fds <= self.base.fds + self.fd_slack,
            "segments flat": last.segments == self.base.segments,
        }
        if rss:
            met[f"RSS growth < {self.rss_growth_limit:.0%}"] = self.rss_growth < (
                self.rss_growth_limit
            )
        return met


class Load:
    """Closed-loop clients over random models, counting requests and errors until stopped."""

    def __init__(
        self, urls: Any, models: Sequence[str], clients: int, max_requests: int, end: float
    ) -> None:
        self.urls, self.models, self.max_requests, self.end = urls, list(models), max_requests, end
        self.requests = self.errors = 0
        self.messages: list[str] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=max(self.end - time.monotonic(), 0) + 120)

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.requests, self.errors

    def _client(self, i: int) -> None:
        http = i % 4 == 3
        if http:
            import tritonclient.http as client_module

            client = client_module.InferenceServerClient(self.urls.http)
        else:
            import tritonclient.grpc as client_module  # type: ignore[no-redef]

            client = client_module.InferenceServerClient(self.urls.grpc)
        rng = random.Random(i)
        images = np.random.default_rng(i).standard_normal((MAX_ROWS, 8, 8, 1)).astype(np.float32)
        sent = 0
        try:
            while time.monotonic() < self.end and sent < self.max_requests:
                rows = rng.randint(1, MAX_ROWS)
                tensor = client_module.InferInput("image", [rows, 8, 8, 1], "FP32")
                tensor.set_data_from_numpy(images[:rows])
                error = None
                try:
                    result = client.infer(rng.choice(self.models), [tensor])
                    if result.as_numpy("logits").shape != (rows, 10):
                        error = f"logits shape {result.as_numpy('logits').shape}, rows {rows}"
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                sent += 1
                with self._lock:
                    self.requests += 1
                    if error is not None:
                        self.errors += 1
                        if len(self.messages) < 5:
                            self.messages.append(error)
        finally:
            client.close()


def server_state(server: Any) -> tuple[int, int, int]:
    """(RSS bytes, open file descriptors, shared-memory segments) of the whole server."""
    rss = process_memory(server.pid)[0] + memory(server, "")[0]
    fds = 0
    for pid in [server.pid, *(s.pid for s in server.stub_processes() if not s.dead)]:
        try:
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    segments = sum(1 for p in Path("/dev/shm").glob("hloserve.*") if _owned(p.name, server.pid))
    return rss, fds, segments


def _owned(name: str, server_pid: int) -> bool:
    """Whether a ``hloserve.<kind>-<server pid>-...`` segment belongs to this server."""
    parts = name.split("-")
    return len(parts) > 1 and parts[1] == str(server_pid)


def soak(
    *,
    minutes: float,
    models: int = 20,
    clients: int = 8,
    interval_s: float = 60.0,
    max_requests: int = 10_000_000,
    out: Any = None,
) -> Report:
    """Build the repository, serve it, run the load; one :class:`Sample` per interval.

    Prints one line per sample to ``out`` (default stdout).
    """
    from hloserve.bundle.bundle import load_bundle
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.build_options import WeightCacheOptions
    from hloserve.node.serve_options import ServeOptions, server_options
    from hloserve.node.tritonserver import TritonServer
    from hloserve.ports import free_ports

    out = out or sys.stdout
    with tempfile.TemporaryDirectory(prefix="hloserve-soak-") as tmp:
        bundles, repo = Path(tmp) / "bundles", Path(tmp) / "repository"
        names = export_digits_copies(bundles, models)
        total = sum(load_bundle(bundles / n).weight_nbytes for n in names)
        budget = total // 3
        cache = WeightCacheOptions(weight_cache_bytes=budget)
        build_repository(bundles, repo, front_instances=1, weight_cache=cache)
        http, grpc, metrics = free_ports(3)
        options = ServeOptions(path=repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
        print(
            f"{models} digits models, weights {total} bytes in all, weight cache budget "
            f"{budget} bytes; {clients} clients ({clients // 4} over HTTP)",
            file=out,
        )
        with TritonServer(server_options(options, repo)) as server:
            start = time.monotonic()
            load = Load(server.urls, names, clients, max_requests, start + minutes * 60)
            load.start()
            samples: list[Sample] = []
            print("minute  requests  errors   RSS MiB   files  segments", file=out)
            seen = (0, 0)
            while time.monotonic() < load.end - 1e-3:
                due = min(start + (len(samples) + 1) * interval_s, load.end)
                time.sleep(max(due - time.monotonic(), 0))
                counts = load.counts()
                rss, fds, segments = server_state(server)
                sample = Sample(
                    (time.monotonic() - start) / 60,
                    counts[0] - seen[0],
                    counts[1] - seen[1],
                    rss,
                    fds,
                    segments,
                )
                seen = counts
                samples.append(sample)
                print(
                    f"{sample.minute:6.2f}  {sample.requests:8d}  {sample.errors:6d}  "
                    f"{rss / MIB:8.0f}  {fds:6d}  {segments:8d}",
                    file=out,
                    flush=True,
                )
            load.join()
            metrics_url = f"http://127.0.0.1:{metrics}/metrics"
            time.sleep(1.5)  # the runtime publishes its metrics once a second
            loads = int(metric_total(metrics_url, "hloserve_weight_loads_total"))
            evictions = int(metric_total(metrics_url, "hloserve_weight_evictions_total"))
            late = load.counts()
            if late != seen:  # requests that ended after the last sample
                last = samples[-1]
                samples[-1] = Sample(
                    last.minute,
                    last.requests + late[0] - seen[0],
                    last.errors + late[1] - seen[1],
                    last.rss,
                    last.fds,
                    last.segments,
                )
    return Report(samples, load.messages, loads, evictions)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long (30)")
    parser.add_argument("--models", type=int, default=20, help="digits copies (20)")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients (8)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds per sample (60)")
    parser.add_argument("--max-requests", type=int, default=10_000_000, help="per client, at most")
    parser.add_argument("--rss-growth", type=float, default=0.05, help="RSS growth limit (0.05)")
    parser.add_argument("--fd-slack", type=int, default=8, help="open files above the base (8)")
    args = parser.parse_args(argv)
    report = soak(
        minutes=args.minutes,
        models=args.models,
        clients=args.clients,
        interval_s=args.interval,
        max_requests=args.max_requests,
    )
    report.rss_growth_limit, report.fd_slack = args.rss_growth, args.fd_slack
    base, last = report.base, report.samples[-1]
    print(f"\nerrors: {report.errors}" + "".join(f"\n  {m}" for m in report.error_messages))
    print(f"weight cache: {report.weight_loads} loads, {report.weight_evictions} evictions")
    print(
        f"RSS {base.rss / MIB:.0f} MiB at minute {base.minute:.1f} -> {last.rss / MIB:.0f} MiB "
        f"at {last.minute:.1f} ({report.rss_growth:+.1%}); files {base.fds} -> {last.fds}; "
        f"segments {base.segments} -> {last.segments}"
    )
    met = report.criteria()
    for name, ok in met.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
