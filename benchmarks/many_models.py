"""Twenty models on one server: hloserve bundles against plain one-file Triton Python models.

    .venv/bin/python benchmarks/many_models.py [--models 20] [--clients 8] [--seconds 10]

One tritonserver serves ``--models`` copies of digits as hloserve bundles (``digits_<i>``: one
front model each, one runtime) and as many plain Triton Python models (``plain_<i>``: JAX in each
stub, jit in ``initialize``, warmed by one request each before measuring). ``--clients`` closed-loop
gRPC clients pick a model of the group at random per request, for ``--seconds`` per group,
groups measured alternately (plain, hloserve, plain, hloserve; the second round is kept).

Prints throughput of each group and the ratio, the memory of each group's stubs (RSS and PSS
from ``/proc/<pid>/smaps_rollup``; tritonserver itself is shared and left out) and the ratio,
and the runtime's mean executed batch size (from ``hloserve_executions_total`` on the metrics
port: requests / executions). A machine shared with other work gives noisy absolute numbers:
read the ratios.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from hloserve import names

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from serve_overhead import PLAIN_CONFIG, PLAIN_MODEL  # noqa: E402


def process_memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes of one process (``/proc/<pid>/smaps_rollup``); (0, 0) once gone."""
    rss = pss = 0
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Rss":
            rss += int(value.split()[0]) * 1024
        elif key == "Pss":
            pss += int(value.split()[0]) * 1024
    return rss, pss


def memory(server: object, prefix: str) -> tuple[int, int]:
    """(RSS, PSS) in bytes of the live stubs of models named ``prefix``*."""
    rss = pss = 0
    for stub in server.stub_processes():  # type: ignore[attr-defined]
        if stub.dead or not stub.model.startswith(prefix):
            continue
        one = process_memory(stub.pid)
        rss, pss = rss + one[0], pss + one[1]
    return rss, pss


def export_digits_copies(bundles: Path, count: int) -> list[str]:
    """Export digits (examples/digits/export.py) into ``bundles`` as ``digits_0`` ..
    ``digits_<count-1>``; their names."""
    sys.path.insert(0, str(ROOT / "examples" / "digits"))
    import export as digits_export

    digits_export.export_digits(bundles)
    shutil.move(bundles / "digits", bundles / "digits_0")
    for i in range(1, count):
        shutil.copytree(bundles / "digits_0", bundles / f"digits_{i}")
    return [f"digits_{i}" for i in range(count)]


def load(url: str, models: list[str], clients: int, seconds: float) -> tuple[float, int]:
    """Closed-loop clients over random models for ``seconds``: (requests/s, requests); errors
    raise."""
    import tritonclient.grpc as grpcclient

    image = np.random.default_rng(0).standard_normal((1, 8, 8, 1)).astype(np.float32)
    counts = [0] * clients
    errors: list[BaseException] = []
    end = time.monotonic() + seconds

    def client(i: int) -> None:
        c = grpcclient.InferenceServerClient(url)
        rng = random.Random(i)
        tensor = grpcclient.InferInput("image", [1, 8, 8, 1], "FP32")
        tensor.set_data_from_numpy(image)
        try:
            while time.monotonic() < end and counts[i] < 1_000_000:
                c.infer(rng.choice(models), [tensor])
                counts[i] += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.monotonic() - start), sum(counts)


def warm(url: str, models: list[str]) -> None:
    """One request per model (a plain model's jit compiles on its first)."""
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("image", [1, 8, 8, 1], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 8, 8, 1), np.float32))
    for m in models:
        c.infer(m, [tensor], client_timeout=300)
    c.close()


def metric_total(metrics_url: str, name: str) -> float:
    """Sum of a Prometheus series ``name`` over its labels, from the server's metrics port."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def executions(metrics_url: str) -> float:
    """Sum of ``hloserve_executions_total`` (the runtime's executions, all models)."""
    return metric_total(metrics_url, "hloserve_executions_total")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=20, help="models per group (20)")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients (8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per group and round (10)")
    parser.add_argument(
        "--front-instances",
        type=int,
        default=names.DEFAULT_FRONT_INSTANCES,
        help=f"per hloserve model ({names.DEFAULT_FRONT_INSTANCES}, the build's default)",
    )
    args = parser.parse_args()

    from hloserve.model_repository_tools.build import build_repository
    from hloserve.node.serve_options import ServeOptions, server_options
    from hloserve.node.tritonserver import TritonServer
    from hloserve.ports import free_ports

    with tempfile.TemporaryDirectory(prefix="hloserve-bench-") as tmp:
        bundles, repo = Path(tmp) / "bundles", Path(tmp) / "repository"
        export_digits_copies(bundles, args.models)
        build_repository(bundles, repo, front_instances=args.front_instances)
        weights = repo / "digits_0" / "1" / "bundle" / "weights.safetensors"
        for i in range(args.models):
            plain = repo / f"plain_{i}"
            (plain / "1").mkdir(parents=True)
            config = textwrap.dedent(PLAIN_CONFIG).replace("digits_plain", f"plain_{i}")
            (plain / "config.pbtxt").write_text(config)
            (plain / "1" / "model.py").write_text(
                PLAIN_MODEL.format(
                    digits_dir=str(ROOT / "examples" / "digits"), weights=str(weights)
                )
            )
        http, grpc, metrics = free_ports(3)
        options = ServeOptions(path=repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
        groups = {
            "plain": [f"plain_{i}" for i in range(args.models)],
            "hloserve": [f"digits_{i}" for i in range(args.models)],
        }
        rates: dict[str, float] = {}
        with TritonServer(server_options(options, repo)) as server:
            warm(server.urls.grpc, [m for models in groups.values() for m in models])
            metrics_url = f"http://127.0.0.1:{metrics}/metrics"
            time.sleep(1.5)  # execution counts are published once a second
            runs0, items = executions(metrics_url), 0
            for _ in range(2):
                for name, models in groups.items():
                    rates[name], count = load(server.urls.grpc, models, args.clients, args.seconds)
                    items += count if name == "hloserve" else 0
            time.sleep(1.5)
            runs1 = executions(metrics_url)
            mem = {
                name: memory(server, prefix)
                for name, prefix in (("plain", "plain_"), ("hloserve", "digits_"))
            }
            runtime = memory(server, "hloserve_runtime")
            mem["hloserve"] = (mem["hloserve"][0] + runtime[0], mem["hloserve"][1] + runtime[1])

    mib = 1024 * 1024
    print(
        f"\n{args.models} digits models per group, {args.clients} closed-loop clients, random model"
    )
    for name in groups:
        rss, pss = mem[name]
        print(
            f"{name:9} {rates[name]:8.0f} infer/s  RSS {rss / mib:7.0f} MiB  PSS {pss / mib:7.0f}"
        )
    print(
        f"ratio hloserve/plain: throughput {rates['hloserve'] / rates['plain']:.2f}x, "
        f"RSS {mem['hloserve'][0] / mem['plain'][0]:.2f}x, "
        f"PSS {mem['hloserve'][1] / mem['plain'][1]:.2f}x"
    )
    per_model = (mem["hloserve"][0] - runtime[0]) / args.models / mib
    print(
        f"hloserve RSS per model (fronts) {per_model:.0f} MiB, runtime {runtime[0] / mib:.0f} MiB"
    )
    print(f"mean executed batch size (hloserve): {items / max(runs1 - runs0, 1):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
