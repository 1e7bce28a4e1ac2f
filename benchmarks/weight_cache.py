"""On-demand weights under load: a working set 3x over the budget vs every model resident.

    .venv/bin/python benchmarks/weight_cache.py [--models 6] [--weight-mib 4] [--requests 600]

Exports ``--models`` bundles ``y = x + sum(w)`` with ``--weight-mib`` MiB of f32 weights each,
builds two repositories from them -- (a) ``--weight-cache-bytes`` = a third of the weights
(``--over`` 3), the first model pinned (``--residency m0=device``); (b) no budget, all
resident -- and serves each in turn with a local tritonserver (nvidia-pytriton wheel). The same
seeded random request mix (``--requests`` from ``--clients`` threads, gRPC, batch 1) runs
against each; every answer is checked. Prints, side by side: throughput, latency p50/p99 and
weight loads per second (from the :8002 metrics). Runs on CPU; on a GPU the loads are
host-to-device copies from pinned memory.

With ``--timeline FILE.json`` it also samples each server's metrics endpoint every
``--sample-s`` seconds while the mix runs (the weight cache's budget and resident bytes, each
model's resident bytes, loads, evictions, executions: what the weight cache dashboard shows)
and writes them with the printed results; ``benchmarks/plot_weight_cache.py`` renders them
as the picture in docs/observability.md.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def export_models(root: Path, count: int, items: int) -> list[str]:
    from hloserve.export import OutputSpec, TensorSpec, export_bundle

    names = []
    for i in range(count):
        export_bundle(
            lambda p, x: x + p["w"].sum(),
            {"w": np.full(items, i + 1, np.float32)},
            [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
            [OutputSpec("y", "nk")],
            [1],
            root / f"m{i}",
        )
        names.append(f"m{i}")
    return names


def metric_sum(url: str, name: str) -> float:
    """Sum of every sample of ``name`` on the Prometheus text endpoint (0 if absent)."""
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


#: Series the timeline keeps: name -> label that splits it (None = summed).
TIMELINE_SERIES = {
    "hloserve_weight_cache_budget_bytes": None,
    "hloserve_weight_cache_resident_bytes": None,
    "hloserve_weight_resident_bytes": "model",
    "hloserve_weight_loads_total": None,
    "hloserve_weight_evictions_total": None,
    "hloserve_executions_total": None,
}


class Sampler:
    """Samples a metrics endpoint every ``period_s`` on a thread until :meth:`stop`.

    Each sample is ``{"t": seconds since start, name: value or {label: value}}`` for the
    series of :data:`TIMELINE_SERIES`.
    """

    def __init__(self, url: str, period_s: float) -> None:
        self.url, self.period_s = url, period_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        from hloserve.prometheus_text import parse_samples

        with urllib.request.urlopen(f"http://{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        row: dict[str, Any] = {"t": time.perf_counter() - self._start}
        for name, split in TIMELINE_SERIES.items():
            row[name] = {} if split else 0.0
        for name, labels, value in parse_samples(text):
            split = TIMELINE_SERIES.get(name, "")
            if split == "":
                continue
            if split is None:
                row[name] += value
            else:
                key = labels.get(split, "")
                row[name][key] = row[name].get(key, 0.0) + value
        self.samples.append(row)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        self.sample()  # the state at the end
        return self.samples


def drive(
    grpc_url: str, models: list[str], items: int, requests: int, clients: int, seed: int
) -> tuple[list[float], float]:
    """Latencies (s) of the seeded request mix and its wall time; raises on a wrong answer."""
    import tritonclient.grpc as grpcclient

    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        rng = np.random.default_rng(seed + k)
        mine = []
        with grpcclient.InferenceServerClient(grpc_url) as c:
            for _ in range(requests // clients):
                i = int(rng.integers(0, len(models)))
                x = rng.integers(-100, 100, (1, 4)).astype(np.float32)
                tensor = grpcclient.InferInput("x", [1, 4], "FP32")
                tensor.set_data_from_numpy(x)
                start = time.perf_counter()
                y = c.infer(models[i], [tensor], client_timeout=120).as_numpy("y")
                mine.append(time.perf_counter() - start)
                if not np.array_equal(y, x + np.float32((i + 1) * items)):
                    errors.append(f"{models[i]}: wrong answer")
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} wrong answers, e.g. {errors[0]}")
    return latencies, wall


def run(repo: Path, log: Path, models: list[str], items: int, args: Any) -> dict[str, Any]:
    from hloserve.node import tritonserver as ts
    from hloserve.node.triton_options import TritonServerOptions
    from hloserve.triton_backend.backends import backend_dirs

    options = TritonServerOptions.on_free_ports(
        repo, extra_backend_dirs=backend_dirs(), log_file=log, startup_timeout_s=300.0
    )
    with ts.TritonServer(options) as server:
        assert server.urls.metrics is not None
        drive(server.urls.grpc, models, items, 4 * args.clients, args.clients, seed=999)  # warm
        loads_before = metric_sum(server.urls.metrics, "hloserve_weight_loads_total")
        sampler = Sampler(server.urls.metrics, args.sample_s) if args.timeline else None
        latencies, wall = drive(
            server.urls.grpc, models, items, args.requests, args.clients, args.seed
        )
        timeline = sampler.stop() if sampler is not None else []
        loads = metric_sum(server.urls.metrics, "hloserve_weight_loads_total") - loads_before
        ms = np.array(latencies) * 1e3
        return {
            "timeline": timeline,
            "requests/s": len(latencies) / wall,
            "p50 ms": float(np.percentile(ms, 50)),
            "p99 ms": float(np.percentile(ms, 99)),
            "mean ms": statistics.fmean(ms),
            "loads/s": loads / wall,
            "loads": loads,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=6)
    parser.add_argument("--weight-mib", type=float, default=4.0, help="weights per model (4)")
    parser.add_argument("--over", type=float, default=3.0, help="working set / budget (3)")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--timeline", type=Path, default=None, metavar="FILE.json",
        help="write the results and metric samples taken during each run here",
    )  # fmt: skip
    parser.add_argument("--sample-s", type=float, default=0.5, help="timeline period (0.5)")
    args = parser.parse_args(argv)

    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.build_options import WeightCacheOptions

    items = int(args.weight_mib * 2**20) // 4
    with tempfile.TemporaryDirectory(prefix="weight_cache_bench.") as tmp:
        root = Path(tmp)
        models = export_models(root / "bundles", args.models, items)
        budget = int(args.models * items * 4 / args.over)
        cached = WeightCacheOptions(weight_cache_bytes=budget, residency={"m0": "device"})
        repos = {
            f"(a) budget {budget / 2**20:.1f} MiB, m0 pinned": cached,
            "(b) all resident": WeightCacheOptions(),
        }
        results = {}
        for label, options in repos.items():
            repo = root / f"repo{len(results)}"
            build_repository(root / "bundles", repo, front_instances=1, weight_cache=options)
            results[label] = run(repo, root / f"{repo.name}.log", models, items, args)
    total = args.models * items * 4 / 2**20
    print(
        f"{args.models} models x {args.weight_mib} MiB = {total:.1f} MiB of weights; "
        f"{args.requests} requests from {args.clients} gRPC clients, batch 1, seed {args.seed}"
    )
    labels = list(results)
    print(f"{'':12s}" + "".join(f"{label:>34s}" for label in labels))
    for key in ("requests/s", "p50 ms", "p99 ms", "mean ms", "loads/s"):
        print(f"{key:12s}" + "".join(f"{results[label][key]:34.2f}" for label in labels))
    a, b = (results[label] for label in labels)
    print(
        f"ratio a/b: throughput {a['requests/s'] / b['requests/s']:.2f}, "
        f"p50 {a['p50 ms'] / b['p50 ms']:.2f}, p99 {a['p99 ms'] / b['p99 ms']:.2f}"
    )
    if args.timeline is not None:
        settings = {k: v for k, v in vars(args).items() if k != "timeline"}
        runs = {label: results[label] for label in labels}
        args.timeline.write_text(
            json.dumps({"settings": settings, "total_mib": total, "runs": runs}, indent=1) + "\n"
        )
        print(f"timeline: {args.timeline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
