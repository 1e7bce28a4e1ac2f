"""Triton's ~500 ms queue stall with a queue policy, per front config variant, in one server.

    .venv/bin/python benchmarks/queue_stall.py [--rounds 3] [--requests 400] [--clients 1]

Builds the digits bundle once per variant (each a front model ``digits_<variant>`` in ONE
tritonserver, one runtime; built with one front instance and ``--max-queue-size``, then the
variant's edit of its config.pbtxt: ``nopolicy`` drops the queue policy, ``policy`` keeps it,
``_inst2`` two instances (the build's default), ``_inflight<N>`` ``hloserve.front_inflight``,
``_delay0`` ``max_queue_delay_microseconds: 0``, ``priority2`` no policy but
``priority_levels: 2``), then, round after round, sends each variant
``--requests`` sequential gRPC requests from each of ``--clients`` threads and counts those
slower than ``--stall-ms`` (100) after the first 20 of each client (warm-up). Prints, per
variant, the stalls of each round, p50/p99/max in ms, and Triton's queue time per request (its
statistics).

Why (tritonserver 2.51, core r24.10): any ``default_queue_policy`` field turns off the priority
queue's prefetching (``PriorityQueue::support_prefetching_``); the dynamic batcher then wakes
for a new request only while an instance thread waits for work
(``RateLimiter::PayloadSlotAvailable`` -> ``WaitingConsumerCount() > 0``), and an instance
thread that comes back for work notifies no one, so a request that arrives just before the
instance thread is back waits for the batcher's 500 ms timeout
(``DynamicBatchScheduler::BatcherThread``, ``default_wait_microseconds``). benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "digits"))

POLICY = re.compile(r"\s*default_queue_policy \{[^}]*\}")


def _inflight(n: int) -> Callable[[str], str]:
    param = f'parameters {{ key: "hloserve.front_inflight" value {{ string_value: "{n}" }} }}\n'
    return lambda text: text + param


def _instances(n: int) -> Callable[[str], str]:
    return lambda text: re.sub(r"count: \d+", f"count: {n}", text, count=1)


def _delay(us: int) -> Callable[[str], str]:
    return lambda text: re.sub(
        r"max_queue_delay_microseconds: \d+", f"max_queue_delay_microseconds: {us}", text
    )


def _chain(*edits: Callable[[str], str]) -> Callable[[str], str]:
    def edit(text: str) -> str:
        for e in edits:
            text = e(text)
        return text

    return edit


#: variant -> edit of the config written with a queue bound (policy: bound + timeouts)
VARIANTS: dict[str, Callable[[str], str]] = {
    "nopolicy": lambda text: POLICY.sub("", text),
    "policy": lambda text: text,
    "policy_inst2": _instances(2),
    "policy_inflight1": _inflight(1),
    "policy_inflight2": _inflight(2),
    "policy_inst2_inflight1": _chain(_instances(2), _inflight(1)),
    "policy_delay0": _delay(0),
    # no queue policy, but priority levels: prefetching is off all the same
    "priority2": lambda text: POLICY.sub(
        "\n  priority_levels: 2\n  default_priority_level: 1", text, count=1
    ),
}


def probe(url: str, model: str, requests: int, clients: int) -> list[float]:
    """Latencies in seconds of ``requests`` sequential requests per client (first 20 dropped)."""
    import tritonclient.grpc as grpcclient

    image = np.zeros((1, 8, 8, 1), np.float32)
    out: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        c = grpcclient.InferenceServerClient(url)
        inp = grpcclient.InferInput("image", list(image.shape), "FP32")
        inp.set_data_from_numpy(image)
        mine = []
        for _ in range(requests):
            t = time.perf_counter()
            c.infer(model, [inp])
            mine.append(time.perf_counter() - t)
        c.close()
        with lock:
            out.extend(mine[20:])

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def queue_ns(url: str, model: str) -> tuple[int, int]:
    """(queue ns, successful requests) from Triton's statistics of ``model``."""
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(url)
    stats = c.get_inference_statistics(model).model_stats[0].inference_stats
    c.close()
    return stats.queue.ns, stats.success.count


def main() -> int:
    """Build, serve, probe every variant round after round, print the table; 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400, help="per client per round")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--stall-ms", type=float, default=100.0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--max-queue-size", type=int, default=128)
    args = parser.parse_args()

    import export as digits_export

    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.build_options import QueueOptions
    from hloserve.node.serve_options import ServeOptions, server_options
    from hloserve.node.tritonserver import TritonServer
    from hloserve.ports import free_ports

    variants = [v for v in args.variants.split(",") if v]
    with tempfile.TemporaryDirectory(prefix="hloserve-stall-") as tmp:
        bundles, repo = Path(tmp) / "bundles", Path(tmp) / "repository"
        digits_export.export_digits(bundles / "src", symbolic=True)
        for v in variants:
            shutil.copytree(bundles / "src" / "digits", bundles / f"digits_{v}")
        shutil.rmtree(bundles / "src")
        # one front instance and a bound on each: the variants edit from there
        queue = QueueOptions(max_queue_size=args.max_queue_size)
        build_repository(bundles, repo, front_instances=1, queue=queue)
        for v in variants:
            config = repo / f"digits_{v}" / "config.pbtxt"
            config.write_text(VARIANTS[v](config.read_text()))
        http, grpc, metrics = free_ports(3)
        options = ServeOptions(path=repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
        results: dict[str, list[list[float]]] = {v: [] for v in variants}
        with TritonServer(server_options(options, repo)) as server:
            url = server.urls.grpc
            for v in variants:  # warm-up
                probe(url, f"digits_{v}", 30, 1)
            before = {v: queue_ns(url, f"digits_{v}") for v in variants}
            for _ in range(args.rounds):
                for v in variants:
                    results[v].append(probe(url, f"digits_{v}", args.requests, args.clients))
            after = {v: queue_ns(url, f"digits_{v}") for v in variants}
    limit = args.stall_ms / 1000
    print(
        f"\ndigits, {args.clients} client(s) x {args.requests - 20} counted requests per round; "
        f"stalls = requests > {args.stall_ms:g} ms; bound {args.max_queue_size}"
    )
    print(
        f"{'variant':26} {'stalls per round':>18} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
        f"{'queue ms/req':>12}"
    )
    for v in variants:
        stalls = [sum(1 for x in r if x > limit) for r in results[v]]
        flat = sorted(x for r in results[v] for x in r)
        q = statistics.quantiles(flat, n=100)
        ns = after[v][0] - before[v][0]
        count = max(1, after[v][1] - before[v][1])
        print(
            f"{v:26} {' '.join(map(str, stalls)):>18} {q[49] * 1e3:7.2f} {q[98] * 1e3:7.2f} "
            f"{flat[-1] * 1e3:7.1f} {ns / count / 1e6:12.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
