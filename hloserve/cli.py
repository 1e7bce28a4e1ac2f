"""The ``hloserve`` command line (``hloserve --help`` lists the subcommands; ``serve``'s
flags are in :mod:`hloserve.cli_serve`, shared option groups in :mod:`hloserve.cli_options`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hloserve import __version__
from hloserve.cli_options import add_build_options, add_config_flag, add_tls_flags, build_options
from hloserve.cli_serve import add_serve
from hloserve.errors import HloserveError


def _bundle_validate(args: argparse.Namespace) -> int:
    from hloserve.bundle.validate import validate_bundle

    failed = 0
    for path in args.bundle_dirs:
        problems = validate_bundle(path)
        errors = [p for p in problems if not p.warning]
        for p in problems:
            print(f"{path.name}/{p}", file=sys.stderr)
        if errors:
            failed += 1
            n = len(errors)
            print(f"{path}: INVALID ({n} problem{'s' * (n != 1)})", file=sys.stderr)
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


def _group(
    commands: Any, name: str, help: str, metavar: str = "ACTION", description: str | None = None
) -> Any:
    """Subcommand ``name`` with actions of its own (``hloserve NAME ACTION``): their parsers."""
    parser = commands.add_parser(name, help=help, description=description)
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar=metavar)


def _add_export(commands: Any) -> None:
    export_cmds = _group(commands, "export", "export a model as a bundle", "FRAMEWORK")
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

    from hloserve.bundle.bundle import load_bundle
    from hloserve.bundle.inspect import render_bundle

    Console().print(render_bundle(load_bundle(args.bundle_dir)))
    return 0


def _bundle_convert(args: argparse.Namespace) -> int:
    from hloserve.bundle.convert import convert_bundle

    converted = convert_bundle(args.bundle_dir, args.target)
    what = "every executable is already a portable artifact"
    if converted:
        what = f"converted {', '.join(converted)} to portable artifacts"
    print(f"{args.bundle_dir}: {what}")
    return 0


def _repo_build(args: argparse.Namespace) -> int:
    from hloserve.model_repository_tools.build import build_repository

    plan = build_repository(
        args.bundles_dir, args.output, build_options(args), overwrite=args.overwrite, progress=print
    )
    print(f"{args.output}: wrote {len(plan.models)} front model(s) and the runtime model")
    return 0


def _repo_validate(args: argparse.Namespace) -> int:
    from hloserve.model_repository_tools.validate import validate_repository

    problems = validate_repository(args.repo_dir)
    for p in problems:
        print(f"{args.repo_dir.name}/{p}", file=sys.stderr)
    if problems:
        print(f"{args.repo_dir}: INVALID ({len(problems)} problem(s))", file=sys.stderr)
        return 1
    print(f"{args.repo_dir}: valid")
    return 0


def _status(args: argparse.Namespace) -> int:
    from hloserve.node.status import fetch_models, print_quietly, render_models, render_status
    from hloserve.prometheus_text import cache_status, fetch_metrics

    if args.models:
        print_quietly(render_models(fetch_models(args.url)))
    else:
        print_quietly(render_status(cache_status(fetch_metrics(args.url))))
    return 0


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


def _node(args: argparse.Namespace) -> int:
    from hloserve.node.node import run_node_down, run_node_up
    from hloserve.node.node_config import load_node_config

    config = load_node_config(args.config)
    if args.node_command == "up":
        return run_node_up(config)
    stopped = run_node_down(config)
    what = f"stopped {', '.join(stopped)}" if stopped else "nothing was running"
    print(f"node {config.name}: {what}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hloserve`` (built on call, never at import)."""
    parser = argparse.ArgumentParser(
        prog="hloserve", description="Serve StableHLO models on NVIDIA Triton Inference Server."
    )
    parser.add_argument("--version", action="version", version=f"hloserve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_export(commands)
    bundle_cmds = _group(commands, "bundle", "check, inspect and convert model bundles")
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
        metavar="VERSION",
        help="StableHLO version to target (default: the oldest supported, widest compatibility)",
    )
    convert.set_defaults(func=_bundle_convert)

    repo_cmds = _group(commands, "repo", "build and check Triton model repositories")
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
    add_build_options(build)
    build.add_argument(
        "--overwrite", action="store_true", help="replace REPO_DIR if hloserve built it, atomically"
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

    add_serve(commands)
    status = commands.add_parser(
        "status",
        help="print a server's weight cache state (from its metrics endpoint), or with "
        "--models each model's version, state and last reload (from serve's admin port)",
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
        help="one KServe V2 endpoint (gRPC, and HTTP with http_listen) over several "
        "tritonservers (docs/gateway.md)",
        description="Forward inference to the workers named in the config file; settings can "
        "be overridden with HLOSERVE_GATEWAY_* variables (docs/gateway.md). Stops on "
        "Ctrl-C/SIGTERM.",
    )
    add_config_flag(gateway, "gateway", "environment")
    add_tls_flags(gateway, "")
    gateway.set_defaults(func=_gateway)
    from hloserve.gateway import ctl

    ctl.add_parser(commands, ctl.run)
    actions = _group(
        commands,
        "node",
        "one tritonserver per GPU (processes or containers) plus the gateway",
        description="Start or stop the workers of this machine from a node file "
        "(docs/deployment.md); settings can be overridden with HLOSERVE_NODE_* variables.",
    )
    for action, text in (
        ("up", "start the workers and the gateway; stop everything on Ctrl-C/SIGTERM"),
        ("down", "stop the node: remove its containers (by label) or end its `node up`"),
    ):
        sub = actions.add_parser(action, help=text, description=text)
        add_config_flag(sub, "node", "HLOSERVE_NODE_*")
        sub.set_defaults(func=_node)
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
