"""The channel's per-request round trip, front -> runtime -> front, without Triton.

    .venv/bin/python benchmarks/channel_roundtrip.py [--requests 2000] [--concurrency 8]
        [--seconds 3] [--untrained] [--json PATH]

A runtime (:class:`RuntimeServer` over the digits bundle) runs in a child process, a front
(:class:`ChannelFront`) in this one, over the real channel (abstract Unix socket, /dev/shm
arena). Measures, side by side in one run:

(1) the raw transport: one small JSON message round trip on the socket (no tensors);
(2) one digits request (batch 1) through the channel, sequential: p50/p99 in us, answered by
    the front's reader thread (``submit``, the in-flight mode) and read by the calling thread
    (``run``, ``inline=True``, what ``execute`` does by default);
(3) the runtime's execution alone (``RuntimeModel.run`` in the child, same inputs);
(4) ``--concurrency`` submitters at once for ``--seconds``: requests/s and the mean executed
    batch size.

``--untrained``: the digits bundle with untrained weights (no scikit-learn, e.g. on the GPU
check's device, docs/gpu_check.md); ``--json PATH`` also writes the numbers there.

The Triton-side cost a front adds on top (the response sender's extra stub -> server message)
is in benchmarks/serve_overhead.py, which runs both inside tritonserver.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _runtime(address: str, bundle: str, ready: Any, stop: Any, stats: Any) -> None:
    from hloserve.bundle.bundle import load_bundle
    from hloserve.triton_backend.runtime.core import RuntimeModel
    from hloserve.triton_backend.runtime.scheduler import SchedulerConfig
    from hloserve.triton_backend.runtime.server import RuntimeServer

    core = RuntimeModel()
    stats["device"] = f"{core.device.device_kind} ({core.device.platform})"
    server = RuntimeServer(core, address=address, scheduler_config=SchedulerConfig("fifo"))
    server.start()
    # (3) the execution alone, same shapes as a batch-1 request
    loaded = core.acquire("digits", Path(bundle))
    x = np.zeros((1, 8, 8, 1), np.float32)
    for _ in range(50):
        core.run(loaded, 0, 1, [x])
    times = []
    for _ in range(500):
        t = time.perf_counter()
        [np.asarray(r) for r in core.run(loaded, 0, 1, [x])]
        times.append(time.perf_counter() - t)
    stats["run_p50_us"] = statistics.median(times) * 1e6
    core.release(loaded.key)
    del load_bundle
    ready.set()
    stop.wait()
    stats["executions"] = server.executions
    stats["items"] = server.items
    server.close()


def _echo(address: str, ready: Any) -> None:
    from hloserve.triton_backend import channel

    sock = channel.listen(address)
    ready.set()
    conn, _ = sock.accept()
    while True:
        try:
            message = channel.receive(conn)
        except channel.ChannelClosed:
            return
        channel.send(conn, {"op": "done", "ids": message.get("ids", [])})


def transport_p50(n: int) -> float:
    """(1): p50 of a small JSON round trip over the abstract SOCK_SEQPACKET socket, us."""
    from hloserve.triton_backend import channel

    address = f"\0hloserve.channel-bench-{uuid.uuid4().hex}"
    ready = mp.Event()
    child = mp.Process(target=_echo, args=(address, ready), daemon=True)
    child.start()
    ready.wait(30)
    sock = channel.connect(address)
    message = {"op": "run", "ids": [1], "works": [{"in": [["", 0]], "out": [["", 256]]}]}
    times = []
    for _ in range(n):
        t = time.perf_counter()
        channel.send(sock, message)
        channel.receive(sock)
        times.append(time.perf_counter() - t)
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    child.join(5)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests (2000)")
    parser.add_argument("--concurrency", type=int, default=8, help="submitters at once (8)")
    parser.add_argument("--seconds", type=float, default=3.0, help="of (4), seconds (3)")
    parser.add_argument(
        "--untrained", action="store_true", help="untrained digits weights (no scikit-learn)"
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="results as JSON")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "examples" / "digits"))
    import export as digits_export

    from hloserve.bundle.bundle import load_bundle
    from hloserve.triton_backend.front.core import FrontModel
    from hloserve.triton_backend.front.front_channel import ChannelFront, Request

    with tempfile.TemporaryDirectory(prefix="hloserve-bench-") as tmp:
        bundles = Path(tmp)
        digits_export.export_digits(bundles, untrained_seed=0 if args.untrained else None)
        bundle = bundles / "digits"
        address = f"\0hloserve.channel-bench-{uuid.uuid4().hex}"
        ctx = mp.get_context("spawn")
        ready, stop, stats = ctx.Event(), ctx.Event(), ctx.Manager().dict()
        child = ctx.Process(target=_runtime, args=(address, str(bundle), ready, stop, stats))
        child.start()
        assert ready.wait(300), "runtime did not start"
        transport = transport_p50(args.requests)

        done: dict[Any, threading.Event] = {}

        def respond(handle: Any, result: Any) -> None:
            if isinstance(result, Exception):
                raise result
            done[handle].set()

        core = FrontModel("digits", load_bundle(bundle))
        front = ChannelFront(core, bundle, respond, address=address)
        front.start(wait_s=120)
        x = np.random.default_rng(0).standard_normal((1, 8, 8, 1)).astype(np.float32)

        def one(i: Any) -> None:
            done[i] = threading.Event()
            front.submit([Request(i, {"image": x})])
            assert done[i].wait(30)
            del done[i]

        for i in range(100):
            one(("warm", i))
        times = []
        for i in range(args.requests):
            t = time.perf_counter()
            one(("seq", i))
            times.append(time.perf_counter() - t)
        q = statistics.quantiles(times, n=100)

        answered: list[Any] = []
        inline = ChannelFront(
            core, bundle, lambda h, r: answered.append(r), address=address, inline=True
        )
        inline.start(wait_s=120)
        inline_times = []
        for i in range(100 + args.requests):
            t = time.perf_counter()
            inline.run([Request(i, {"image": x})])
            if i >= 100:
                inline_times.append(time.perf_counter() - t)
        assert len(answered) == 100 + args.requests
        assert not any(isinstance(r, Exception) for r in answered), answered[:3]
        inline.close()
        qi = statistics.quantiles(inline_times, n=100)

        count = [0]
        lock = threading.Lock()
        end = time.perf_counter() + args.seconds

        def worker(w: int) -> None:
            n = 0
            while time.perf_counter() < end and n < 100_000:
                one((w, n))
                n += 1
            with lock:
                count[0] += n

        before = dict(stats)
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.concurrency)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        front.close()
        stop.set()
        child.join(30)
        del before

    run = stats["run_p50_us"]
    device = stats["device"]
    print(f"\nchannel round trip (pid {os.getpid()}), digits batch 1, runtime on {device}")
    print(f"(1) transport alone, small JSON message:     p50 {transport:7.1f} us")
    p50, p99 = q[49] * 1e6, q[98] * 1e6
    print(f"(2) one request through the channel:         p50 {p50:7.1f} us, p99 {p99:7.1f} us")
    print(
        f"    read on the calling thread (inline):     p50 {qi[49] * 1e6:7.1f} us, "
        f"p99 {qi[98] * 1e6:7.1f} us"
    )
    print(f"(3) the runtime's execution alone:           p50 {run:7.1f} us")
    print(f"    channel overhead per request (2) - (3):  p50 {p50 - run:7.1f} us")
    items, executions = stats["items"], stats["executions"]
    print(
        f"(4) {args.concurrency} submitters: {count[0] / elapsed:7.0f} requests/s, mean "
        f"executed batch {items / max(executions, 1):.2f} ({executions} executions, all phases)"
    )
    if args.json is not None:
        result = {
            "device": device,
            "transport_p50_us": transport,
            "request_p50_us": p50,
            "request_p99_us": p99,
            "inline_p50_us": qi[49] * 1e6,
            "inline_p99_us": qi[98] * 1e6,
            "execution_p50_us": run,
            "overhead_p50_us": p50 - run,
            "concurrency": args.concurrency,
            "requests_per_s": count[0] / elapsed,
            "mean_executed_batch": items / max(executions, 1),
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
