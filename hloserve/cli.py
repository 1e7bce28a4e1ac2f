"""The ``hloserve`` command line.

Subcommands:
    export torch PKG.MOD:FACTORY    export a PyTorch module as a bundle (docs/bundles.md, PyTorch)
    bundle validate BUNDLE_DIR...   check bundles; one line per problem on stderr; exit 1 if any
    bundle inspect BUNDLE_DIR       table of tensors, batch sizes, executables, weight bytes
    bundle convert BUNDLE_DIR       rewrite MLIR text executables as portable artifacts
    repo build BUNDLES_DIR -o REPO  validate every bundle, then write a Triton model repository
    repo validate REPO_DIR          check a repository's configs against their bundles
    serve PATH [--workers N]        serve bundles with tritonserver (N > 1: behind the gateway);
                                    --watch follows the bundles directory while serving
    status URL                      print a server's weight cache state (metrics endpoint)
    status --models ADMIN_URL       each model's version, state, last reload, error
    gateway --config FILE           one KServe V2 gRPC endpoint over several tritonservers
    gateway-ctl ACTION              read/change a running gateway's scheduling (control plane)
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hloserve import __version__
from hloserve.errors import HloserveError, InvalidArgumentError
from hloserve.model_repository_tools import names


def _bundle_validate(args: argparse.Namespace) -> int:
    from hloserve.bundle import validate_bundle

    failed = 0
    for path in args.bundle_dirs:
        problems = validate_bundle(path)
        errors = [p for p in problems if not p.warning]
        for p in problems:
            print(f"{path.name}/{p}", file=sys.stderr)
        if errors:
            failed += 1
            print(
                f"{path}: INVALID ({len(errors)} problem{'s' * (len(errors) != 1)})",
                file=sys.stderr,
            )
        else:
            print(f"{path}: valid")
    return 1 if failed else 0


def _export_torch(args: argparse.Namespace) -> int:
    from hloserve.export._cli import export_torch_command

    if not args.verbose:  # the progress lines say it; the exporter's log would repeat them
        logging.getLogger("hloserve.export").setLevel(logging.WARNING)
    export_torch_command(
        args.factory,
        args.input,
        args.output,
        args.batch_sizes,
        args.out,
        variants=args.variant,
        overwrite=args.overwrite,
    )
    return 0


def _add_export(commands: Any) -> None:
    export = commands.add_parser("export", help="export a model as a bundle")
    export_cmds = export.add_subparsers(dest="export_command", required=True, metavar="FRAMEWORK")
    torch = export_cmds.add_parser(
        "torch",
        help="export a torch.nn.Module (through torchax; pip install 'hloserve[export-torch]')",
        description="Import PACKAGE.MODULE (the current directory is on the path), call "
        "FACTORY(), which returns the module in eval mode, and write one StableHLO portable "
        "artifact per batch size (and variant) with the module's parameters and buffers as "
        "weights, printing a line per executable. "
        "Tensors use the manifest's notation (docs/bundles.md): --input NAME:DTYPE:SHAPE[:DIMS], "
        "--output NAME:SHAPE.",
    )
    torch.add_argument("factory", metavar="PACKAGE.MODULE:FACTORY")
    torch.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="NAME:DTYPE:SHAPE[:DIMS]",
        help="an input, in forward's argument order, e.g. x:f32:nchw:c=3,h=224,w=224 (repeat)",
    )
    torch.add_argument(
        "--output",
        action="append",
        required=True,
        metavar="NAME:SHAPE",
        help="an output, in forward's return order, e.g. logits:nk (repeat)",
    )
    torch.add_argument(
        "--batch-sizes",
        required=True,
        metavar="N,N,...",
        help="batch sizes to compile, e.g. 1,8,32 ('' for an unbatched model)",
    )
    torch.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="A=SIZE[,...]",
        help="sizes of the variable (-1) input axes for one shape variant, e.g. s=32 (repeat)",
    )
    torch.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="bundle directory (model name)"
    )
    torch.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    torch.set_defaults(func=_export_torch)


def _bundle_inspect(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hloserve.bundle import load_bundle
    from hloserve.bundle.inspect import render_bundle

    Console().print(render_bundle(load_bundle(args.bundle_dir)))
    return 0


def _bundle_convert(args: argparse.Namespace) -> int:
    from hloserve.bundle.convert import convert_bundle

    converted = convert_bundle(args.bundle_dir, args.target)
    if converted:
        print(f"{args.bundle_dir}: converted {', '.join(converted)} to portable artifacts")
    else:
        print(f"{args.bundle_dir}: every executable is already a portable artifact")
    return 0


def _repo_build(args: argparse.Namespace) -> int:
    from hloserve.model_repository_tools import build_repository

    plan = build_repository(
        args.bundles_dir,
        args.output,
        front_instances=args.front_instances,
        max_queue_delay_us=args.max_queue_delay_us,
        weight_cache=_weight_cache_options(args),
        meta_concurrency=args.meta_concurrency,
        batch_sizes=_batch_size_options(args),
        max_request_bytes=args.max_request_bytes,
        scheduling=_scheduling_options(args),
        overwrite=args.overwrite,
        progress=print,
        executable_cache=_executable_cache_options(args),
    )
    print(f"{args.output}: wrote {len(plan.models)} front model(s) and the runtime model")
    return 0


def _repo_validate(args: argparse.Namespace) -> int:
    from hloserve.model_repository_tools import validate_repository

    problems = validate_repository(args.repo_dir)
    for p in problems:
        print(f"{args.repo_dir.name}/{p}", file=sys.stderr)
    if problems:
        print(f"{args.repo_dir}: INVALID ({len(problems)} problem(s))", file=sys.stderr)
        return 1
    print(f"{args.repo_dir}: valid")
    return 0


def _status(args: argparse.Namespace) -> int:
    from hloserve.node.status import cache_status, fetch_metrics, print_quietly, render_status

    if args.models:
        from hloserve.node.status import fetch_models, render_models

        print_quietly(render_models(fetch_models(args.url)))
        return 0

    print_quietly(render_status(cache_status(fetch_metrics(args.url))))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from hloserve.node.serve import ServeOptions, run_serve

    return run_serve(
        ServeOptions(
            path=args.path,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            host=args.host,
            model_control_mode=args.model_control_mode,
            load_models=tuple(args.load_model),
            repository_out=args.repository_out,
            front_instances=args.front_instances,
            max_queue_delay_us=args.max_queue_delay_us,
            weight_cache=_weight_cache_options(args),
            executable_cache=_executable_cache_options(args),
            meta_concurrency=args.meta_concurrency,
            batch_sizes=_batch_size_options(args),
            max_request_bytes=args.max_request_bytes,
            scheduling=_scheduling_options(args),
            tritonserver_args=tuple(args.tritonserver_args),
            log_verbose=args.log_verbose,
            startup_timeout_s=args.startup_timeout,
            workers=args.workers,
            worker_port_base=args.worker_port_base,
            gateway_config=args.gateway_config,
            admin_port=args.admin_port,
            watch=args.watch,
            watch_interval_s=args.watch_interval,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
        )
    )


def _gateway(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from hloserve.gateway.app import run_gateway
    from hloserve.gateway.config import load_config, with_tls

    config = with_tls(load_config(args.config), args.tls_cert, args.tls_key, args.tls_client_ca)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_gateway(config, stop)

    asyncio.run(serve())
    return 0


def _gateway_ctl(args: argparse.Namespace) -> int:
    from hloserve.gateway.ctl import run

    return run(args)


def _add_weight_cache_options(parser: argparse.ArgumentParser) -> None:
    """--weight-cache-bytes, --residency, --compaction-interval (docs/on_demand_weights.md)."""
    parser.add_argument(
        "--weight-cache-bytes",
        type=int,
        default=0,
        metavar="N",
        help="byte budget of the runtime's device weight cache, pinned models included "
        "(default: 0 = no budget, every model's weights stay on the device); "
        "docs/on_demand_weights.md",
    )
    parser.add_argument(
        "--weight-cache-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="instead of --weight-cache-bytes: the budget as a fraction in (0, 1] of the device "
        "memory free when the runtime starts (no budget on CPU); execution scratch is not "
        "reserved, so leave room",
    )
    parser.add_argument(
        "--residency",
        action="append",
        default=[],
        metavar="MODEL=RESIDENCY",
        help="where MODEL's weights live: system (default: host copy, loaded on demand), "
        "device (pinned on the device), unpinned (re-read from the file per load); repeatable",
    )
    parser.add_argument(
        "--compaction-interval",
        type=int,
        default=0,
        metavar="N",
        help="free every on-demand device buffer each N on-demand loads (default: 0 = off)",
    )


def _add_max_request_bytes_option(parser: argparse.ArgumentParser) -> None:
    """--max-request-bytes (docs/serving.md, "Front model config")."""
    from hloserve.model_repository_tools.names import DEFAULT_MAX_REQUEST_BYTES

    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        metavar="N",
        help="largest request a front model accepts, bytes of its input tensors; a larger one "
        f"gets INVALID_ARGUMENT naming the limit (default: {DEFAULT_MAX_REQUEST_BYTES} = 1 GiB)",
    )


def _add_batch_size_option(parser: argparse.ArgumentParser) -> None:
    """--batch-sizes (docs/bundles.md, "Symbolic batch")."""
    parser.add_argument(
        "--batch-sizes",
        action="append",
        default=[],
        metavar="[MODEL=]SIZES",
        help="compiled batch sizes of symbolic-batch bundles, e.g. 1,4,16,64 for all of them "
        "or MODEL=1,8 for one (repeatable); default: 1,4,16,64 within each bundle's "
        "constraints and 64 MiB of inputs+outputs per execution. A bundle exported with "
        "fixed batch sizes keeps them and refuses this flag",
    )


def _batch_size_options(args: argparse.Namespace) -> Any:
    """The ``BatchSizeOptions`` of :func:`_add_batch_size_option`'s argument."""
    from hloserve.model_repository_tools.batch_sizes import parse_batch_sizes

    return parse_batch_sizes(args.batch_sizes)


def _weight_cache_options(args: argparse.Namespace) -> Any:
    """The ``WeightCacheOptions`` of :func:`_add_weight_cache_options`'s arguments.

    Raises:
        InvalidArgumentError: a malformed ``--residency``.
    """
    from hloserve.model_repository_tools import WeightCacheOptions
    from hloserve.model_repository_tools.names import parse_residency

    try:
        residency = parse_residency(",".join(args.residency))
    except ValueError as exc:
        raise InvalidArgumentError(f"--residency: {exc}") from None
    return WeightCacheOptions(
        weight_cache_bytes=args.weight_cache_bytes,
        weight_cache_fraction=args.weight_cache_fraction,
        residency=residency,
        compaction_interval=args.compaction_interval,
    )


def _add_scheduling_options(parser: argparse.ArgumentParser) -> None:
    """--scheduling, --model-weight (docs/scheduling.md)."""
    parser.add_argument(
        "--scheduling",
        choices=("fair", "fifo", "edf"),
        default="fair",
        help="the runtime's scheduling discipline across models: fair (default: compute "
        "shared by weight), fifo (globally oldest request first) or edf (soonest deadline "
        "first, hopeless requests shed); docs/scheduling.md",
    )
    parser.add_argument(
        "--model-weight",
        action="append",
        default=[],
        metavar="MODEL=W",
        help="MODEL's weight under fair scheduling (W > 0; default 1.0); repeatable",
    )


def _scheduling_options(args: argparse.Namespace) -> Any:
    """The ``SchedulingOptions`` of :func:`_add_scheduling_options`'s arguments.

    Raises:
        InvalidArgumentError: a malformed ``--model-weight`` or a weight <= 0.
    """
    from hloserve.model_repository_tools import SchedulingOptions
    from hloserve.model_repository_tools.names import parse_model_weights

    try:
        weights = parse_model_weights(",".join(args.model_weight))
    except ValueError as exc:
        raise InvalidArgumentError(f"--model-weight: {exc}") from None
    return SchedulingOptions(scheduling=args.scheduling, model_weights=weights)


def _add_executable_cache_options(parser: argparse.ArgumentParser) -> None:
    """--executable-cache, --executable-cache-bytes (docs/serving.md, "Executable cache")."""
    parser.add_argument(
        "--executable-cache",
        default="",
        metavar="DIR",
        help="where the runtime keeps compiled executables, so restarts load them instead of "
        "compiling; 'off' disables it (default: $HLOSERVE_EXECUTABLE_CACHE, else "
        "$XDG_CACHE_HOME/hloserve/executables, i.e. ~/.cache/hloserve/executables)",
    )
    parser.add_argument(
        "--executable-cache-bytes",
        type=int,
        default=0,
        metavar="N",
        help="size bound of the executable cache in bytes; least recently used entries are "
        "deleted beyond it (default: $HLOSERVE_EXECUTABLE_CACHE_BYTES, else 4 GiB)",
    )


def _executable_cache_options(args: argparse.Namespace) -> Any:
    """The ``ExecutableCacheOptions`` of :func:`_add_executable_cache_options`'s arguments
    (a directory made absolute: the runtime runs elsewhere).

    Raises:
        InvalidArgumentError: --executable-cache-bytes below 0.
    """
    from hloserve.model_repository_tools import ExecutableCacheOptions
    from hloserve.model_repository_tools.names import EXECUTABLE_CACHE_OFF

    if args.executable_cache_bytes < 0:
        raise InvalidArgumentError(
            f"--executable-cache-bytes must be >= 0, got {args.executable_cache_bytes}"
        )
    directory = args.executable_cache.strip()
    if directory.lower() == EXECUTABLE_CACHE_OFF:
        directory = EXECUTABLE_CACHE_OFF
    elif directory:
        directory = str(Path(directory).expanduser().absolute())
    return ExecutableCacheOptions(directory=directory, max_bytes=args.executable_cache_bytes)


def _add_serve(commands: argparse._SubParsersAction) -> None:
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
        default=None,
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
        default=None,
        help="tritonserver --model-control-mode; by default explicit with --load-model=* "
        "(everything loads at start, and a model whose process dies is reloaded), the "
        "repository API (load/unload) restricted to clients sending the header "
        "hloserve-model-control with the key of HLOSERVE_MODEL_CONTROL_KEY (default: random)",
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
        default=None,
        metavar="DIR",
        help="keep the repository built from bundles here (default: a temporary directory)",
    )
    serve.add_argument(
        "--front-instances",
        type=int,
        default=names.DEFAULT_FRONT_INSTANCES,
        metavar="N",
        help=f"CPU instances per front model when building ({names.DEFAULT_FRONT_INSTANCES})",
    )
    serve.add_argument(
        "--meta-concurrency",
        type=int,
        default=2,
        metavar="N",
        help="meta model runs at once on the worker, across all metas, when building (2)",
    )
    serve.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=500,
        metavar="US",
        help="dynamic batcher queue delay when building, microseconds (500)",
    )
    _add_max_request_bytes_option(serve)
    _add_weight_cache_options(serve)
    _add_batch_size_option(serve)
    _add_scheduling_options(serve)
    _add_executable_cache_options(serve)
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
        default=1,
        metavar="N",
        help="tritonservers to run; above 1 the gateway listens on --grpc-port (admin HTTP on "
        "--metrics-port) and routes over them (docs/gateway.md) (1)",
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
        default=None,
        metavar="FILE",
        help="with --workers: gateway settings (mode, scheduling, ...); serve sets its "
        "workers, listen and admin ports",
    )
    _add_tls_flags(serve, "with --workers: ")
    serve.add_argument(
        "--watch",
        action="store_true",
        help="PATH a bundles directory: load added bundles, reload changed ones and unload "
        "removed ones while serving, each once two polls see the same content "
        "(docs/serving.md, 'Watching the bundles directory'); one worker only",
    )
    serve.add_argument(
        "--watch-interval",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="with --watch: seconds between two polls of the bundles directory (15)",
    )
    serve.set_defaults(func=_serve, tritonserver_args=[])


def _add_tls_flags(parser: argparse.ArgumentParser, prefix: str) -> None:
    """``--tls-cert``, ``--tls-key``, ``--tls-client-ca``: TLS on the gateway's public port."""
    parser.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"{prefix}TLS on the gateway's gRPC port: certificate chain, PEM (plaintext is "
        "then refused; overrides tls: in the gateway file)",
    )
    parser.add_argument(
        "--tls-key", type=Path, default=None, metavar="FILE", help="the certificate's key, PEM"
    )
    parser.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="require client certificates signed by these CAs, PEM (default: none asked)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hloserve`` (built on call, never at import)."""
    parser = argparse.ArgumentParser(
        prog="hloserve",
        description="Serve StableHLO models on NVIDIA Triton Inference Server.",
    )
    parser.add_argument("--version", action="version", version=f"hloserve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_export(commands)
    bundle = commands.add_parser("bundle", help="check, inspect and convert model bundles")
    bundle_cmds = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    validate = bundle_cmds.add_parser(
        "validate",
        help="check bundles against the format (manifest, weights, every executable's signature)",
        description="Exit 0 when every bundle is valid; otherwise exit 1 with one line per "
        "problem on stderr naming the file, the tensor or weight, and expected vs actual.",
    )
    validate.add_argument("bundle_dirs", nargs="+", type=Path, metavar="BUNDLE_DIR")
    validate.set_defaults(func=_bundle_validate)
    inspect = bundle_cmds.add_parser("inspect", help="print a table of a bundle's contents")
    inspect.add_argument("bundle_dir", type=Path, metavar="BUNDLE_DIR")
    inspect.set_defaults(func=_bundle_inspect)
    convert = bundle_cmds.add_parser(
        "convert",
        help="rewrite MLIR text executables (.mlir) as StableHLO portable artifacts (.mlirbc)",
    )
    convert.add_argument("bundle_dir", type=Path, metavar="BUNDLE_DIR")
    convert.add_argument(
        "--target",
        default=None,
        metavar="VERSION",
        help="StableHLO version to target (default: the oldest supported, widest compatibility)",
    )
    convert.set_defaults(func=_bundle_convert)

    repo = commands.add_parser("repo", help="build and check Triton model repositories")
    repo_cmds = repo.add_subparsers(dest="repo_command", required=True, metavar="ACTION")
    build = repo_cmds.add_parser(
        "build",
        help="write a Triton model repository serving every bundle in BUNDLES_DIR",
        description="Validate every bundle first (one invalid bundle: its problems are printed, "
        "exit 1, nothing is written), then write the repository atomically: built beside "
        "REPO_DIR and renamed into place. Layout: docs/serving.md.",
    )
    build.add_argument("bundles_dir", type=Path, metavar="BUNDLES_DIR")
    build.add_argument(
        "-o", "--output", type=Path, required=True, metavar="REPO_DIR", help="repository to write"
    )
    build.add_argument(
        "--front-instances",
        type=int,
        default=names.DEFAULT_FRONT_INSTANCES,
        metavar="N",
        help=f"CPU instances of each front model (default: {names.DEFAULT_FRONT_INSTANCES})",
    )
    build.add_argument(
        "--meta-concurrency",
        type=int,
        default=2,
        metavar="N",
        help="meta model runs at once on the worker, across all metas (default: 2; "
        "docs/meta_models.md)",
    )
    build.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=500,
        metavar="D",
        help="dynamic batcher max_queue_delay_microseconds (default: 500)",
    )
    _add_max_request_bytes_option(build)
    _add_weight_cache_options(build)
    _add_batch_size_option(build)
    _add_scheduling_options(build)
    _add_executable_cache_options(build)
    build.add_argument(
        "--overwrite", action="store_true", help="replace REPO_DIR if it exists (atomically)"
    )
    build.set_defaults(func=_repo_build)
    repo_validate = repo_cmds.add_parser(
        "validate",
        help="check that every config parses and matches its bundle copy",
        description="Exit 0 when the repository is consistent; otherwise exit 1 with one line "
        "per problem on stderr.",
    )
    repo_validate.add_argument("repo_dir", type=Path, metavar="REPO_DIR")
    repo_validate.set_defaults(func=_repo_validate)

    _add_serve(commands)
    status = commands.add_parser(
        "status",
        help="print a server's weight cache state (from its metrics endpoint)",
        description="Read the hloserve_weight_* series of a tritonserver's Prometheus endpoint "
        "and print the weight cache as a table: budget, resident total, and per model its "
        "residency, weight bytes, resident bytes, loads, evictions and mean load time "
        "(docs/on_demand_weights.md).",
    )
    status.add_argument(
        "url",
        metavar="URL",
        help="metrics endpoint: HOST:PORT (8002) or a URL; with --models the supervisor's "
        "admin port (8003)",
    )
    status.add_argument(
        "--models",
        action="store_true",
        help="print each model's version, state, last reload and error instead, read from "
        "the admin port of hloserve serve (--admin-port; docs/serving.md)",
    )
    status.set_defaults(func=_status)
    gateway = commands.add_parser(
        "gateway",
        help="one KServe V2 gRPC endpoint over several tritonservers (docs/gateway.md)",
        description="Forward inference to the workers named in the config file; settings can "
        "be overridden with HLOSERVE_GATEWAY_* variables (docs/gateway.md). Stops on "
        "Ctrl-C/SIGTERM.",
    )
    gateway.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="gateway YAML file (default: environment variables only)",
    )
    _add_tls_flags(gateway, "")
    gateway.set_defaults(func=_gateway)
    from hloserve.gateway.ctl import add_parser as add_gateway_ctl

    add_gateway_ctl(commands, _gateway_ctl)
    from hloserve.node.cli_node import add_parser as add_node

    add_node(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hloserve`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # everything after `--` belongs to tritonserver
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    if passthrough:
        if args.command != "serve":
            build_parser().error("arguments after `--` are only for `hloserve serve`")
        args.tritonserver_args = passthrough
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # JAX logs its platform probing at INFO through a handler of its own: keep it to warnings.
    logging.getLogger("jax").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.func(args))
    except HloserveError as exc:
        print(f"error ({exc.status.value}): {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
