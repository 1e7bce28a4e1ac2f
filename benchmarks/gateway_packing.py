"""lpt_packing vs round_robin on the same skewed traffic over three real tritonservers (issue 5).

    .venv/bin/python benchmarks/gateway_packing.py [--requests 1920] [--threads 64]
        [--client python|perf_analyzer]
        [--no-preferred]

Six copies of one tiny exported model (``m0`` .. ``m5``; batch sizes 1, 2, 4, 8; one CPU
instance each; dynamic batcher queue delay ``--queue-delay-us``) are served by three
tritonservers. The same gateway configuration runs twice, ``mode: round_robin`` then
``mode: lpt_packing`` (``m0`` with 2 replicas, fill mode ``run``, quantum = max batch 8 x 1.0
items). Each phase: a warm-up of the same traffic, one discovery tick for the rate estimates,
an operator repack through the control plane (lpt_packing), then ``--requests`` requests of
batch 1 from ``--threads`` closed-loop threads, the model of each drawn with skewed weights
(same seeds in both phases).

Prints, per phase, the mean batch size Triton executed (sum of ``inference_count`` / sum of
``execution_count`` over every worker and model, deltas over the measured part) and, for
lpt_packing, the requests the gateway routed to each replica of ``m0`` (from the control
plane's ``GetSchedulingStatus``) against the fill quantum. Then the ratios lpt_packing /
round_robin of mean batch sizes and of throughput (requests/s of the measured part), through
HAProxy. The machine is noisy: read the ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient

from hloserve.export import OutputSpec, TensorSpec, export_bundle
from hloserve.gateway.config import GatewayConfig
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.build_options import SchedulingOptions
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.perf_analyzer import perf_analyzer_binary, perf_analyzer_env
from hloserve.node.serve_options import ServeOptions, server_options
from hloserve.node.tritonserver import TritonServer
from hloserve.ports import free_ports
from hloserve.protos import gateway_control_pb2 as pb
from hloserve.protos import gateway_control_pb2_grpc as pb_grpc

MODELS = ("m0", "m1", "m2", "m3", "m4", "m5")
WEIGHTS = (0.35, 0.25, 0.15, 0.12, 0.08, 0.05)  # m0 (2 replicas) heaviest
MAX_BATCH = 8


def _affine(params: dict[str, Any], x: Any) -> Any:
    return x @ params["w"] + params["b"]


def _export(bundles: Path) -> None:
    params = {
        "w": np.arange(12, dtype=np.float32).reshape(4, 3) / 10,
        "b": np.array([0.5, -0.5, 1.0], np.float32),
    }
    first = bundles / MODELS[0]
    export_bundle(
        _affine,
        params,
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
        [OutputSpec("y", "nj")],
        [1, 2, 4, MAX_BATCH],
        first,
    )
    for name in MODELS[1:]:
        shutil.copytree(first, bundles / name)


def _stats(servers: list[TritonServer]) -> dict[tuple[str, str], tuple[int, int]]:
    """(model, worker) -> (inference_count, execution_count)."""
    out = {}
    for server in servers:
        client = grpcclient.InferenceServerClient(server.urls.grpc)
        for row in client.get_inference_statistics().model_stats:
            if row.name in MODELS:
                out[(row.name, server.urls.grpc)] = (row.inference_count, row.execution_count)
        client.close()
    return out


def _traffic(address: str, requests: int, threads: int, seed: int) -> list[str]:
    """``requests`` batch-1 requests from ``threads`` closed-loop threads; returns errors."""
    errors: list[str] = []
    per_thread = requests // threads
    x = np.ones((1, 4), np.float32)

    def worker(index: int) -> None:
        rng = np.random.default_rng(seed + index)
        names = rng.choice(len(MODELS), size=per_thread, p=WEIGHTS)
        client = grpcclient.InferenceServerClient(address)
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(x)
        for i in names:
            try:
                client.infer(MODELS[i], [tensor])
            except Exception as exc:  # counted and reported
                errors.append(str(exc))
        client.close()

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(300)
    return errors


def _perf_analyzer_traffic(address: str, requests: int, threads: int) -> list[str]:
    """The same skew from perf_analyzer (C++ clients): one process per model, its concurrency
    and request count in proportion to the model's weight (``round(threads x weight)``, at
    least 1). Returns errors (a failed perf_analyzer run is one error per its requests)."""
    env = perf_analyzer_env()
    procs = []
    for name, weight in zip(MODELS, WEIGHTS, strict=True):
        argv = [
            str(perf_analyzer_binary()), "-m", name, "-u", address, "-i", "grpc",
            "--concurrency-range", f"{max(1, round(threads * weight))}",
            "--request-count", str(max(1, round(requests * weight))),
            "--shape", "x:1,4",
        ]  # fmt: skip
        procs.append(
            (
                name,
                weight,
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                ),
            )
        )
    errors: list[str] = []
    for name, weight, proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            errors += [f"{name}: perf_analyzer failed: {out[-400:]}"] * round(requests * weight)
    return errors


@dataclasses.dataclass
class Phase:
    mode: str
    mean_batch: float
    inferences: int
    executions: int
    seconds: float
    m0_routed: dict[str, int]
    placement: dict[str, tuple[str, ...]]
    errors: int


def _status(port: int) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.GatewayControlStub(channel).GetSchedulingStatus(
            pb.GetSchedulingStatusRequest(), timeout=10
        )


def _routed(status: Any) -> dict[tuple[str, str], int]:
    return {(m.name, r.worker): r.routed_total for m in status.models for r in m.replicas}


def run_phase(mode: str, servers: list[TritonServer], args: argparse.Namespace) -> Phase:
    config = GatewayConfig.model_validate(
        {
            "workers": [s.urls.grpc for s in servers],
            "mode": mode,
            "discovery": {"poll_interval_seconds": 1.0},
            "scheduling": {
                "first_rebalance_compute_seconds": 1e6,  # only the operator repack below
                "rebalance_compute_seconds": 1e6,
                "routing_fill_mode": "run",
                "models": {"m0": {"replicas": 2}},
            },
        }
    )
    gateway = GatewayThread(config.model_copy(update={"listen": "127.0.0.1:0", "admin_port": 0}))
    address = f"127.0.0.1:{gateway.port}"
    try:
        traffic = (
            (lambda n, seed: _traffic(address, n, args.threads, seed))
            if args.client == "python"
            else (lambda n, seed: _perf_analyzer_traffic(address, n, args.threads))
        )
        traffic(args.requests // 4, 1000)  # warm-up
        time.sleep(2.5)  # discovery ticks: rate and cost estimates
        if mode == "lpt_packing":
            with grpc.insecure_channel(address) as channel:
                pb_grpc.GatewayControlStub(channel).Repack(pb.RepackRequest(), timeout=10)
        before, routed_before = _stats(servers), _routed(_status(gateway.port))
        start = time.perf_counter()
        errors = traffic(args.requests, 0)
        seconds = time.perf_counter() - start
        expected = sum(v[0] for v in before.values()) + args.requests - len(errors)
        deadline = time.monotonic() + 10
        while True:  # Triton counts after the response: poll (bounded) until all are counted
            after = _stats(servers)
            if sum(v[0] for v in after.values()) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        status = _status(gateway.port)
    finally:
        gateway.close()
    inferences = sum(after[k][0] - before.get(k, (0, 0))[0] for k in after)
    executions = sum(after[k][1] - before.get(k, (0, 0))[1] for k in after)
    routed = _routed(status)
    m0 = next(m for m in status.models if m.name == "m0")
    return Phase(
        mode=mode,
        mean_batch=inferences / max(executions, 1),
        inferences=inferences,
        executions=executions,
        seconds=seconds,
        m0_routed={
            r.worker: routed[("m0", r.worker)] - routed_before.get(("m0", r.worker), 0)
            for r in m0.replicas
        },
        placement={m.name: tuple(r.worker for r in m.replicas) for m in status.models},
        errors=len(errors),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1920)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--queue-delay-us", type=int, default=2000)
    parser.add_argument(
        "--no-preferred",
        action="store_true",
        help="drop dynamic_batching.preferred_batch_size from the models' configs (with the "
        "compiled sizes 1, 2, 4, 8 preferred, Triton executes the largest preferred size the "
        "queue fills: 4 of 7 queued requests)",
    )
    parser.add_argument(
        "--client",
        choices=("python", "perf_analyzer"),
        default="python",
        help="closed-loop load from Python threads (models drawn at random per request) or "
        "from one perf_analyzer per model (concurrency and count by weight: far less client "
        "CPU per request, so the workers, not the client, are the bottleneck)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        bundles = Path(tmp) / "bundles"
        bundles.mkdir()
        _export(bundles)
        repo = Path(tmp) / "repository"
        build_repository(  # lpt_packing needs fifo/edf workers (docs/scheduling.md)
            bundles,
            repo,
            front_instances=1,
            max_queue_delay_us=args.queue_delay_us,
            scheduling=SchedulingOptions(scheduling="fifo"),
        )
        if args.no_preferred:  # Triton's batcher then takes every queued request (up to 8)
            for name in MODELS:
                config = repo / name / "config.pbtxt"
                text = re.sub(r"\s*preferred_batch_size: \d+", "", config.read_text())
                config.write_text(text)
        servers = []
        for i in range(3):
            http, grpc_port, metrics = free_ports(3)
            options = ServeOptions(
                path=repo, http_port=http, grpc_port=grpc_port, metrics_port=metrics
            )
            opts = dataclasses.replace(
                server_options(options, repo),
                log_file=Path(tmp) / f"worker{i}.log",
                startup_timeout_s=300.0,
            )
            servers.append(stack.enter_context(TritonServer(opts)))
        print(
            f"3 workers ready; {args.requests} requests, {args.threads} {args.client} clients, "
            "weights "
            f"{dict(zip(MODELS, WEIGHTS, strict=True))}, queue delay {args.queue_delay_us} us"
        )
        phases = [run_phase(mode, servers, args) for mode in ("round_robin", "lpt_packing")]

    quantum = MAX_BATCH  # max batch x routing_fill_factor 1.0
    for p in phases:
        print(
            f"{p.mode:12s} mean batch {p.mean_batch:.3f} ({p.inferences} inferences /"
            f" {p.executions} executions) in {p.seconds:.1f} s"
            f" ({p.inferences / p.seconds:.0f} infer/s), {p.errors} errors"
        )
    lpt = phases[1]
    shares = sorted(lpt.m0_routed.values())
    print(f"lpt_packing placement: {lpt.placement}")
    print(
        f"lpt_packing m0 routed per replica: {lpt.m0_routed}; difference"
        f" {shares[-1] - shares[0]} vs fill quantum {quantum}"
        f" ({'within' if shares[-1] - shares[0] <= quantum else 'OVER'})"
    )
    rr = phases[0]
    print(
        "lpt_packing / round_robin: mean batch "
        f"{lpt.mean_batch / rr.mean_batch:.2f}x, throughput "
        f"{(lpt.inferences / lpt.seconds) / (rr.inferences / rr.seconds):.2f}x"
    )


if __name__ == "__main__":
    main()
