"""What the gateway costs: one tritonserver measured directly and through the gateway, one run.

    .venv/bin/python benchmarks/gateway_overhead.py [--seconds 3] [--concurrency 8] [--rounds 3]

One worker serves the golden ``affine`` bundle (a tiny model, so the gateway's share of each
request is as large as it gets: the worst case) and the gateway
(:class:`hloserve.node.fleet.LocalFleet`, mode ``round_robin``, default admission bounds)
runs in front of it in this process, as ``hloserve serve --workers`` runs it. perf_analyzer
(gRPC, random batch-1 data, ``--concurrency`` outstanding requests: saturation on this
machine) measures the worker's own port and the gateway's port alternately, ``--rounds``
times, each a ``--seconds`` window. Prints the median throughput (inferences/s) and latency
p50/p99 (microseconds) of each path, then the ratios gateway/direct. The machine is noisy
(2 shared cores): read the ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window (3)")
    parser.add_argument("--concurrency", type=int, default=8, help="outstanding requests (8)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per path (3)")
    args = parser.parse_args()

    from hloserve.gateway.config import GatewayConfig
    from hloserve.model_repository_tools import build_repository
    from hloserve.node.fleet import LocalFleet
    from hloserve.node.perf_analyzer import PerfResult, run_perf_analyzer
    from hloserve.node.serve import ServeOptions, server_options
    from hloserve.node.tritonserver import free_ports

    with tempfile.TemporaryDirectory(prefix="hloserve-gateway-overhead-") as tmp:
        bundles = Path(tmp) / "bundles"
        bundles.mkdir()
        shutil.copytree(GOLDEN / "affine", bundles / "affine")
        repo = Path(tmp) / "repository"
        build_repository(bundles, repo)
        http, grpc, metrics, listen = free_ports(4)
        worker = server_options(
            ServeOptions(path=repo, http_port=http, grpc_port=grpc, metrics_port=metrics), repo
        )
        config = GatewayConfig(
            listen=f"127.0.0.1:{listen}", admin_port=0, workers=(f"127.0.0.1:{grpc}",)
        )
        with LocalFleet([worker], config) as fleet:
            assert fleet.gateway is not None
            paths = {"direct": fleet.servers[0].urls.grpc, "gateway": fleet.gateway.address}
            results: dict[str, list[PerfResult]] = {name: [] for name in paths}
            for _ in range(args.rounds):
                for name, url in paths.items():
                    (result,), _ = run_perf_analyzer(
                        "affine",
                        url,
                        concurrency=(args.concurrency,),
                        measurement_interval_ms=int(args.seconds * 1000),
                    )
                    results[name].append(result)

    def median(name: str, field: str) -> float:
        return statistics.median(getattr(r, field) for r in results[name])

    print(
        f"affine, batch 1, concurrency {args.concurrency}, {args.rounds} rounds of "
        f"{args.seconds:g} s per path (medians)"
    )
    print(f"{'path':<8} {'infer/s':>10} {'p50 us':>10} {'p99 us':>10}")
    for name in results:
        print(
            f"{name:<8} {median(name, 'throughput'):>10.0f} {median(name, 'p50_us'):>10.0f}"
            f" {median(name, 'p99_us'):>10.0f}"
        )
    print(
        "gateway/direct: throughput "
        f"{median('gateway', 'throughput') / median('direct', 'throughput'):.2f}x, p50 "
        f"{median('gateway', 'p50_us') / median('direct', 'p50_us'):.2f}x, p99 "
        f"{median('gateway', 'p99_us') / median('direct', 'p99_us'):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
