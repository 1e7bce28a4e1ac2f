"""What the gateway costs: one tritonserver measured directly and through the gateway.

    .venv/bin/python benchmarks/gateway_overhead.py [--seconds 2] [--concurrency 1 8] [--rounds 3]
        [--no-http] [--pass-through] [--http-json] [--stability-percentage 50]

One worker serves the golden ``affine`` bundle (a tiny model, so the gateway's share of each
request is as large as it gets: the worst case). A gateway runs in front of it, as
``hloserve serve --workers`` runs one (:class:`hloserve.node.gateway_thread.GatewayThread`, mode
``round_robin``, default admission bounds): ``haproxy`` (HAProxy carries ModelInfer).
perf_analyzer (gRPC, random batch-1 data) measures the worker's own port and the gateway's
in turn, ``--rounds`` times per concurrency level, each a ``--seconds`` window. Prints the
median throughput (inferences/s), latency p50/p99 (microseconds) and the data plane's CPU per
request (microseconds): HAProxy's processes (``/proc/<pid>/stat`` of the master and its
workers) divided by the requests the worker counted (``ModelStatistics``) during the run,
warm-up and stabilisation windows included. Then the ratios gateway/direct and the p50 the
gateway adds. KServe HTTP too (unless ``--no-http``): perf_analyzer ``-i http`` on the
worker's HTTP port (``http``) and on the gateway's (``haproxy-http``), CPU per request again
HAProxy's. With ``--pass-through`` a third
HAProxy (``haproxy-pass``) runs the gateway's own configuration with every ``http-request``
rule removed and one backend, the worker: HAProxy's own cost of carrying gRPC (HTTP/2 on both
sides) on this machine, so the routing's share is ``haproxy`` minus ``haproxy-pass``. With
``--http-json`` perf_analyzer also sends KServe HTTP with every tensor in the JSON
(``--input-tensor-format json --output-tensor-format json``) to the worker (``http-json``) and
to the gateway (``haproxy-http-json``), where each request takes the control plane's shape
check (docs/gateway.md, "KServe HTTP"); CPU per request is HAProxy's plus this process's
(the control plane). The machine is noisy (2 shared cores): read the ratios, not absolute
numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"


def _cpu_seconds(pid: int | str) -> float:
    """User + system CPU seconds of a process (``/proc/<pid>/stat`` fields 14, 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    pids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids += [int(p) for p in task.read_text().split()]
        except OSError:
            continue
    return pids


def haproxy_cpu_seconds(master: int) -> float:
    """CPU seconds of an HAProxy master and its live workers."""
    return _cpu_seconds(master) + sum(_cpu_seconds(p) for p in _children(master))


def pass_through_config(config_text: str, port: int) -> str:
    """The gateway's HAProxy configuration as a plain proxy on ``port``: gRPC frontend only,
    no ``http-request`` rule, every request to the one model backend (``m_affine``); no master
    socket, stats socket or exporter (those belong to the gateway's own HAProxy)."""
    lines = []
    for line in (
        config_text.split("frontend prometheus")[0].split("\nfrontend http\n")[0].splitlines()
    ):
        if line.startswith(("  http-request", "  master-worker", "  stats socket")):
            continue
        if line.startswith("  bind ") and " proto h2" in line:
            line = f"  bind 127.0.0.1:{port} proto h2"
        if line.startswith("  use_backend"):
            line = "  use_backend m_affine"
        lines.append(line)
    return "\n".join(lines) + "\n"


def haproxy_masters() -> list[int]:
    """This process's HAProxy children (each gateway's master), oldest first."""
    pids = _children(os.getpid())
    return sorted(p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "haproxy")


@dataclass
class Row:
    throughput: float
    p50_us: float
    p99_us: float
    cpu_us: float | None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measurement window (2)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 8], help="levels (1 8: saturation)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per path and level (3)")
    parser.add_argument(
        "--pass-through",
        action="store_true",
        help="also measure HAProxy as a plain gRPC proxy (haproxy-pass: the gateway's "
        "configuration without its routing rules)",
    )
    parser.add_argument(
        "--no-http",
        dest="http",
        action="store_false",
        help="skip KServe HTTP (measured by default: the worker's HTTP port and HAProxy's)",
    )
    parser.add_argument(
        "--http-json",
        action="store_true",
        help="also KServe HTTP with the tensors in the JSON (the gateway's shape-checked path)",
    )
    parser.add_argument(
        "--stability-percentage",
        type=float,
        default=50.0,
        help="perf_analyzer's --stability-percentage (50, as hloserve.node.perf_analyzer runs it:"
        " with perf_analyzer's own 10 the p99 of a 2-core machine rarely settles)",
    )
    args = parser.parse_args()

    import tritonclient.grpc as grpcclient

    from hloserve.gateway.config import GatewayConfig
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.node.gateway_thread import GatewayThread
    from hloserve.node.perf_analyzer import run_perf_analyzer
    from hloserve.node.serve_options import ServeOptions, server_options
    from hloserve.node.tritonserver import TritonServer
    from hloserve.ports import free_ports

    rows: dict[tuple[str, int], list[Row]] = {}
    with tempfile.TemporaryDirectory(prefix="hloserve-gateway-overhead-") as tmp:
        bundles = Path(tmp) / "bundles"
        bundles.mkdir()
        shutil.copytree(GOLDEN / "affine", bundles / "affine")
        repo = Path(tmp) / "repository"
        build_repository(bundles, repo)
        http, grpc, metrics, haproxy_port, haproxy_http = free_ports(5)
        worker = server_options(
            ServeOptions(path=repo, http_port=http, grpc_port=grpc, metrics_port=metrics), repo
        )
        with TritonServer(worker) as server:
            endpoint = f"127.0.0.1:{grpc}"
            direct = grpcclient.InferenceServerClient(endpoint)

            def served() -> int:
                stats = direct.get_inference_statistics("affine").model_stats[0]
                return int(stats.inference_stats.success.count)

            config = GatewayConfig(
                listen=f"127.0.0.1:{haproxy_port}",
                admin_port=0,
                workers=(endpoint,),
                http_listen=f"127.0.0.1:{haproxy_http}",
                worker_http=(server.urls.http,),
            )
            gateways = {"haproxy": GatewayThread(config)}
            (master,) = haproxy_masters()
            plain = None
            if args.pass_through:  # the gateway's own file, from its master's command line
                argv = Path(f"/proc/{master}/cmdline").read_bytes().decode().split("\0")
                (pass_port,) = free_ports(1)
                pass_cfg = Path(tmp) / "haproxy-pass.cfg"
                text = Path(argv[argv.index("-f") + 1]).read_text()
                pass_cfg.write_text(pass_through_config(text, pass_port))
                plain = subprocess.Popen(
                    [argv[0], "-db", "-f", str(pass_cfg)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
                if plain.poll() is not None:
                    raise SystemExit(f"the pass-through HAProxy did not start ({pass_cfg})")
            cpu: dict[str, Callable[[], float] | None] = {
                "direct": None,
                "haproxy": lambda: haproxy_cpu_seconds(master),
                "haproxy-pass": (lambda: _cpu_seconds(plain.pid)) if plain else None,
                "http": None,
                "haproxy-http": lambda: haproxy_cpu_seconds(master),
                "http-json": None,
                "haproxy-http-json": lambda: haproxy_cpu_seconds(master) + _cpu_seconds("self"),
            }
            paths = {  # name -> (url, protocol, perf_analyzer flags)
                "direct": (server.urls.grpc, "grpc", ()),
                **{name: (g.address, "grpc", ()) for name, g in gateways.items()},
            }
            if plain is not None:
                paths["haproxy-pass"] = (f"127.0.0.1:{pass_port}", "grpc", ())
            if args.http:
                paths["http"] = (server.urls.http, "http", ())
                paths["haproxy-http"] = (f"127.0.0.1:{haproxy_http}", "http", ())
            if args.http_json:
                json_flags = ("--input-tensor-format", "json", "--output-tensor-format", "json")
                paths["http-json"] = (server.urls.http, "http", json_flags)
                paths["haproxy-http-json"] = (f"127.0.0.1:{haproxy_http}", "http", json_flags)
            try:
                for level in args.concurrency:
                    for _ in range(args.rounds):
                        for name, (url, protocol, flags) in paths.items():
                            meter = cpu[name]
                            cpu_before, count_before = (meter() if meter else 0.0), served()
                            (result,), _ = run_perf_analyzer(
                                "affine",
                                url,
                                protocol=protocol,
                                concurrency=(level,),
                                measurement_interval_ms=int(args.seconds * 1000),
                                extra_args=(
                                    *flags,
                                    f"--stability-percentage={args.stability_percentage:g}",
                                ),
                            )
                            requests = max(1, served() - count_before)
                            used = (meter() - cpu_before) / requests * 1e6 if meter else None
                            rows.setdefault((name, level), []).append(
                                Row(result.throughput, result.p50_us, result.p99_us, used)
                            )
            finally:
                for gateway in gateways.values():
                    gateway.close()
                if plain is not None:
                    plain.terminate()
                    plain.wait(10)

    def median(name: str, level: int, field: str) -> float:
        values = [getattr(r, field) for r in rows[(name, level)]]
        return float(statistics.median(v for v in values if v is not None))

    print(f"affine, batch 1, {args.rounds} rounds of {args.seconds:g} s per path (medians)")
    header = ("path", "clients", "infer/s", "p50 us", "p99 us", "CPU us/req")
    print(f"{header[0]:<17} " + " ".join(f"{h:>9}" for h in header[1:]))
    for level in args.concurrency:
        for name in paths:
            cpu_cell = "-" if cpu[name] is None else f"{median(name, level, 'cpu_us'):.0f}"
            print(
                f"{name:<17} {level:>9} {median(name, level, 'throughput'):>9.0f}"
                f" {median(name, level, 'p50_us'):>9.0f} {median(name, level, 'p99_us'):>9.0f}"
                f" {cpu_cell:>9}"
            )
    pairs = [("haproxy", "direct")]
    if args.pass_through:
        pairs += [("haproxy-pass", "direct"), ("haproxy", "haproxy-pass")]
    if args.http:
        pairs.append(("haproxy-http", "http"))
    if args.http_json:
        pairs.append(("haproxy-http-json", "http-json"))
    for level in args.concurrency:
        for name, base in pairs:
            ratio = median(name, level, "throughput") / median(base, level, "throughput")
            added = median(name, level, "p50_us") - median(base, level, "p50_us")
            print(
                f"{name}/{base} at {level} client(s): throughput {ratio:.2f}x, "
                f"p50 +{added:.0f} us, p99 "
                f"{median(name, level, 'p99_us') / median(base, level, 'p99_us'):.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
