"""``hloserve serve``'s flags and the call that turns them into :class:`ServeOptions`.

The serving itself is :func:`hloserve.node.serve.run_serve` (docs/serving.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hloserve.cli_options import add_build_options, add_tls_flags, build_options


def _serve(args: argparse.Namespace) -> int:
    from hloserve.node.serve import run_serve
    from hloserve.node.serve_options import ServeOptions

    return run_serve(
        ServeOptions(
            **{name: getattr(args, name) for name in _SAME_NAMES},
            load_models=tuple(args.load_model),
            open_repository_api=args.open_repository_api,
            build=build_options(args),
            tritonserver_args=tuple(args.tritonserver_args),
            startup_timeout_s=args.startup_timeout,
            watch_interval_s=args.watch_interval,
        )
    )


#: The ``ServeOptions`` fields whose flag has the same name (``--http-port`` -> ``http_port``).
_SAME_NAMES = (
    *("path", "http_port", "grpc_port", "metrics_port", "host", "model_control_mode"),
    *("repository_out", "log_verbose", "workers", "gpus", "worker_port_base", "gateway_config"),
    *("admin_port", "watch", "tls_cert", "tls_key", "tls_client_ca"),
)


def add_serve(commands: argparse._SubParsersAction) -> None:
    """Add ``serve`` and its flags (docs/serving.md) to the ``hloserve`` subcommands."""
    serve = commands.add_parser(
        "serve",
        help="serve bundles (or a built repository) with a local tritonserver",
        description="Serve PATH with tritonserver from the nvidia-pytriton wheel. PATH is a "
        "bundles directory (built into a model repository first) or a model repository from "
        "`hloserve repo build`. Prints the endpoints, waits until every model is ready, passes "
        "the server log through, and stops everything on Ctrl-C or SIGTERM. Arguments after "
        "`--` go to tritonserver unchanged (e.g. -- --log-info=false).",
    )
    serve.add_argument("path", type=Path, metavar="PATH", help="bundles directory or repository")
    serve.add_argument("--http-port", type=int, default=8000, help="KServe V2 HTTP (8000)")
    serve.add_argument("--grpc-port", type=int, default=8001, help="KServe V2 gRPC (8001)")
    serve.add_argument("--metrics-port", type=int, default=8002, help="Prometheus (8002)")
    serve.add_argument(
        "--admin-port",
        type=int,
        metavar="PORT",
        help="the supervisor's own /metrics (workers up, restarts, stub reloads; "
        "docs/observability.md); default 8003, off with a warning when taken; 0 = a free port",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (127.0.0.1; 0.0.0.0 serves every interface)",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=("none", "poll", "explicit"),
        help="tritonserver --model-control-mode; by default explicit with --load-model=* "
        "(everything loads at start, and a model whose process dies is reloaded), the "
        "repository API (load/unload) restricted to clients sending the header "
        "hloserve-model-control with the key of HLOSERVE_MODEL_CONTROL_KEY (default: random)",
    )
    serve.add_argument(
        "--open-repository-api",
        action="store_true",
        help="Triton's repository API (index, load, unload) without a key or token on "
        "--grpc-port/--http-port, as on a plain tritonserver, so Triton's model-control "
        "clients work unchanged. The gateway serves those ports, even with one worker (one "
        "HAProxy hop more), and refuses loads that would stop a worker; the workers keep the "
        "key. A load may carry model files and a Python model is code: whoever reaches the "
        "ports can run code as the server (docs/serving.md)",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="with explicit mode: a model to load at start (repeatable; '*' for all)",
    )
    serve.add_argument(
        "--repository-out",
        type=Path,
        metavar="DIR",
        help="keep the repository built from bundles here (default: a temporary directory)",
    )
    add_build_options(serve, " when building")
    serve.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose")
    serve.add_argument(
        "--startup-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long models may take to load and warm up (600)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="tritonservers to run, each on its own GPU: the first N visible GPUs (default: one "
        "per visible GPU, one CPU worker without GPUs); above 1 (or with "
        "--open-repository-api) the gateway listens on --grpc-port/--http-port (admin HTTP "
        "on --metrics-port) and routes over them (docs/deployment.md)",
    )
    serve.add_argument(
        "--gpus",
        metavar="all|none|0,1,...",
        help="the GPUs to serve on, one worker each (NVML / nvidia-smi indices, PCI bus order; "
        "CUDA_VISIBLE_DEVICES restricts them); none = CPU workers (--workers of them)",
    )
    serve.add_argument(
        "--worker-port-base",
        type=int,
        default=8100,
        metavar="PORT",
        help="with --workers: worker i binds HTTP, gRPC, metrics on PORT+3i..PORT+3i+2 "
        "(8100; 0 = free ports)",
    )
    serve.add_argument(
        "--gateway-config",
        type=Path,
        metavar="FILE",
        help="with --workers or --open-repository-api: gateway settings (mode, scheduling, "
        "...); serve sets its workers, listen and admin ports",
    )
    add_tls_flags(serve, "with --workers or --open-repository-api: ")
    serve.add_argument(
        "--watch",
        action="store_true",
        help="PATH a bundles directory: load added bundles, reload changed ones and unload "
        "removed ones while serving, each once two polls see the same content "
        "(docs/serving.md, 'Watching the bundles directory'); with --workers, on every worker",
    )
    serve.add_argument(
        "--watch-interval",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="with --watch: seconds between two polls of the bundles directory (15)",
    )
    serve.set_defaults(func=_serve, tritonserver_args=[])
