"""What serving through hloserve costs, side by side in one run, on the digits model.

    .venv/bin/python benchmarks/serve_overhead.py [--seconds 2] [--concurrency 8]

(a) the JAX function called directly in this process (jit, host arrays in and out);
(b) the same JAX model as a plain one-file Triton Python model, as a user would write it by hand
    (``backend: "python"``, dynamic batching, jit in ``initialize``);
(c) hloserve: front model + runtime model over the channel (docs/serving.md), the digits bundle
    exported with a symbolic batch axis and compiled at ``--batch-sizes`` (1,2,4,8,16,32 by
    default: the runtime coalesces queued requests only into compiled sizes, so a dense ladder
    lets 2 to 7 queued requests run as one execution; ``export`` keeps the example's own
    artifacts at 1, 8 and 32). The plain model compiles whatever size Triton's batcher gives it.
(b) and (c) run in ONE tritonserver and are measured alternately by perf_analyzer (gRPC).
Prints latency p50/p99 (microseconds) and throughput (inferences/s) at batch 1 with one client
and under load (``--concurrency`` clients), then the ratios c/b and c/a. The machine is noisy:
read ratios, not absolute numbers.

Measured 2026-11-30 (2 shared CPU cores, load average 4-9), two runs: (b) p50 1495/1488 us,
p99 4081/5792 us, 614/580 infer/s with one client, 2050/2625 under 8; (c) p50 2256/2200 us,
p99 8524/7319 us, 385/403 and 946/1091 infer/s: ratio c/b p50 1.5x, throughput 0.63-0.70x
(one client) and 0.42-0.46x (8 clients). Where the time goes: docs/serving.md, "Front ->
runtime (BLS)".
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FRONT_INFLIGHT = "hloserve.front_inflight"
sys.path.insert(0, str(ROOT / "examples" / "digits"))

PLAIN_MODEL = """
import sys
sys.path.insert(0, {digits_dir!r})
import jax, numpy as np
import triton_python_backend_utils as pb_utils
from safetensors.numpy import load_file
import digits_model


def _unflatten(flat):
    params = {{}}
    for key, value in flat.items():
        layer, name = key.split(".")
        params.setdefault(layer, {{}})[name] = value
    return params


class TritonPythonModel:
    def initialize(self, args):
        self.params = jax.device_put(_unflatten(load_file({weights!r})))
        self.apply = jax.jit(digits_model.apply)

    def execute(self, requests):
        images = [pb_utils.get_input_tensor_by_name(r, "image").as_numpy() for r in requests]
        logits = np.asarray(self.apply(self.params, np.concatenate(images)))
        responses, start = [], 0
        for image in images:
            out = logits[start : start + len(image)]
            start += len(image)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("logits", out)]))
        return responses
"""

PLAIN_CONFIG = """
name: "digits_plain"
backend: "python"
max_batch_size: 32
input [{ name: "image" data_type: TYPE_FP32 dims: [8, 8, 1] }]
output [{ name: "logits" data_type: TYPE_FP32 dims: [10] }]
instance_group [{ count: 1 kind: KIND_CPU }]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


def measure_direct(weights: Path, seconds: float, concurrency: int) -> dict[str, float]:
    """(a): jit-compiled apply on one image, from 1 and from ``concurrency`` threads."""
    import digits_model
    import jax
    from safetensors.numpy import load_file

    params: dict[str, dict[str, np.ndarray]] = {}
    for key, value in load_file(str(weights)).items():
        layer, name = key.split(".")
        params.setdefault(layer, {})[name] = value
    params = jax.device_put(params)
    apply = jax.jit(digits_model.apply)
    image = np.zeros((1, 8, 8, 1), np.float32)
    np.asarray(apply(params, image))  # compile
    latencies = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and len(latencies) < 200_000:
        t = time.perf_counter()
        np.asarray(apply(params, image))
        latencies.append(time.perf_counter() - t)
    count = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def worker() -> None:
        n = 0
        while time.perf_counter() < stop and n < 200_000:
            np.asarray(apply(params, image))
            n += 1
        with lock:
            count[0] += n

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q = statistics.quantiles(latencies, n=100)
    return {
        "p50_us": q[49] * 1e6,
        "p99_us": q[98] * 1e6,
        "throughput_1": len(latencies) / seconds,
        "throughput_n": count[0] / seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measurement window (2)")
    parser.add_argument("--concurrency", type=int, default=8, help="clients under load (8)")
    parser.add_argument(
        "--front-instances", type=int, default=None, help="hloserve front (build default)"
    )
    parser.add_argument(
        "--inflight",
        default="",
        help="also measure hloserve with these hloserve.front_inflight values, e.g. 0,2 "
        "(each as model digits_inflight<N>, (d), (e), ...)",
    )
    parser.add_argument(
        "--instances",
        default="",
        help="also measure hloserve with these front instance counts, e.g. 2 "
        "(each as model digits_instances<N>, after the --inflight ones)",
    )
    parser.add_argument(
        "--unbounded",
        default="",
        help="also measure hloserve with no default_queue_policy at these front instance "
        "counts, e.g. 2 (a front of two instances otherwise gets the default bound; each as model "
        "digits_unbounded<N>, after the --instances ones)",
    )
    parser.add_argument(
        "--request-count",
        type=int,
        default=0,
        help="measure this many requests per figure instead of windows until two agree (a "
        "loaded machine, or a p99 set by rare ~500 ms stalls, may never settle)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measured rounds after one warm-up round; each figure is the median (1)",
    )
    parser.add_argument(
        "--no-preferred",
        action="store_true",
        help="also measure hloserve with no dynamic_batching.preferred_batch_size (model "
        "digits_nopreferred, after the --instances ones)",
    )
    parser.add_argument(
        "--batch-sizes",
        default="1,2,4,8,16,32",
        help="hloserve's compiled batch sizes (1,2,4,8,16,32), or 'export' for the example's "
        "per-size artifacts (1, 8, 32)",
    )
    args = parser.parse_args()

    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.build_options import BatchSizeOptions
    from hloserve.node.perf_analyzer import run_perf_analyzer
    from hloserve.node.serve_options import ServeOptions, server_options
    from hloserve.node.tritonserver import TritonServer
    from hloserve.ports import free_ports

    sys.path.insert(0, str(ROOT / "examples" / "digits"))
    import export as digits_export

    with tempfile.TemporaryDirectory(prefix="hloserve-bench-") as tmp:
        bundles, repo = Path(tmp) / "bundles", Path(tmp) / "repository"
        symbolic = args.batch_sizes != "export"
        digits_export.export_digits(bundles, symbolic=symbolic)
        # extra hloserve models: (name, description, config.pbtxt edit)
        extra: list[tuple[str, str, Callable[[str], str]]] = []
        for n in (int(v) for v in args.inflight.split(",") if v.strip()):
            param = f'parameters {{ key: "{FRONT_INFLIGHT}" value {{ string_value: "{n}" }} }}\n'
            extra.append((f"digits_inflight{n}", f"inflight {n}", lambda t, p=param: t + p))
        for n in (int(v) for v in args.instances.split(",") if v.strip()):
            extra.append(
                (
                    f"digits_instances{n}",
                    f"{n} front instances",
                    lambda t, n=n: re.sub(r"count: \d+", f"count: {n}", t, count=1),
                )
            )
        for n in (int(v) for v in args.unbounded.split(",") if v.strip()):
            extra.append(
                (
                    f"digits_unbounded{n}",
                    f"{n} inst., no queue policy",
                    lambda t, n=n: re.sub(
                        r"\s*default_queue_policy \{[^}]*\}",
                        "",
                        re.sub(r"count: \d+", f"count: {n}", t, count=1),
                    ),
                )
            )
        if args.no_preferred:
            extra.append(
                (
                    "digits_nopreferred",
                    "no preferred sizes",
                    lambda t: re.sub(r"\s*preferred_batch_size: \d+", "", t),
                )
            )
        for name, _, _ in extra:
            shutil.copytree(bundles / "digits", bundles / name)
        build_kwargs: dict[str, object] = (
            {} if args.front_instances is None else {"front_instances": args.front_instances}
        )
        if symbolic:
            sizes = tuple(int(v) for v in args.batch_sizes.split(","))
            build_kwargs["batch_sizes"] = BatchSizeOptions(default=sizes)
        build_repository(bundles, repo, **build_kwargs)
        for name, _, edit in extra:
            config = repo / name / "config.pbtxt"
            config.write_text(edit(config.read_text()))
        plain = repo / "digits_plain"
        (plain / "1").mkdir(parents=True)
        (plain / "config.pbtxt").write_text(textwrap.dedent(PLAIN_CONFIG))
        (plain / "1" / "model.py").write_text(
            PLAIN_MODEL.format(
                digits_dir=str(ROOT / "examples" / "digits"),
                weights=str(repo / "digits" / "1" / "bundle" / "weights.safetensors"),
            )
        )
        http, grpc, metrics = free_ports(3)
        options = ServeOptions(path=repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
        rows: dict[str, dict[str, float]] = {}
        with TritonServer(server_options(options, repo)) as server:
            interval = int(args.seconds * 1000)
            samples: dict[str, list[dict[str, float]]] = {}
            for round_ in range(1 + args.rounds):  # alternate; round 0 only warms up
                models = [("b", "digits_plain"), ("c", "digits")]
                models += [(chr(ord("d") + i), name) for i, (name, _, _) in enumerate(extra)]
                for label, model in models:
                    (one,), _ = run_perf_analyzer(
                        model,
                        server.urls.grpc,
                        concurrency=(1,),
                        measurement_interval_ms=interval,
                        request_count=args.request_count or None,
                    )
                    (load,), _ = run_perf_analyzer(
                        model,
                        server.urls.grpc,
                        measurement_interval_ms=interval,
                        concurrency=(args.concurrency,),
                        request_count=args.request_count or None,
                    )
                    if round_ == 0:
                        continue
                    samples.setdefault(label, []).append(
                        {
                            "p50_us": one.p50_us,
                            "p99_us": one.p99_us,
                            "throughput_1": one.throughput,
                            "throughput_n": load.throughput,
                            "p99_n_us": load.p99_us,
                        }
                    )
            for label, runs in samples.items():  # the median of each figure over the rounds
                rows[label] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows["a"] = measure_direct(
            bundles / "digits" / "weights.safetensors", args.seconds, args.concurrency
        )

    names = {"a": "JAX direct", "b": "plain Triton Python model", "c": "hloserve"}
    for i, (_, description, _) in enumerate(extra):
        names[chr(ord("d") + i)] = f"hloserve, {description}"
    print(
        f"\ndigits, batch 1 per request; load = {args.concurrency} concurrent clients; "
        f"hloserve batch sizes {args.batch_sizes}; median of {args.rounds} rounds"
    )
    print(f"{'':28} {'p50 us':>9} {'p99 us':>9} {'infer/s (1)':>12} {'infer/s (load)':>15}")
    for key in sorted(rows):
        r = rows[key]
        print(
            f"({key}) {names[key]:24} {r['p50_us']:9.0f} {r['p99_us']:9.0f} "
            f"{r['throughput_1']:12.0f} {r['throughput_n']:15.0f}"
        )
    for num, den in [("c", "b"), ("c", "a")] + [(k, "b") for k in sorted(rows) if k > "c"]:
        n, d = rows[num], rows[den]
        print(
            f"ratio {num}/{den}: p50 {n['p50_us'] / d['p50_us']:.2f}x, "
            f"p99 {n['p99_us'] / d['p99_us']:.2f}x, "
            f"throughput(1) {n['throughput_1'] / d['throughput_1']:.2f}x, "
            f"throughput(load) {n['throughput_n'] / d['throughput_n']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
