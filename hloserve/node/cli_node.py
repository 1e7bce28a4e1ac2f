"""The ``hloserve node up|down`` subcommands (registered by :func:`add_parser`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _node(args: argparse.Namespace) -> int:
    from hloserve.node.node import run_node_down, run_node_up
    from hloserve.node.node_config import load_node_config

    config = load_node_config(args.config)
    if args.node_command == "up":
        return run_node_up(config)
    stopped = run_node_down(config)
    if stopped:
        print(f"node {config.name}: stopped {', '.join(stopped)}")
    else:
        print(f"node {config.name}: nothing was running")
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``node up`` and ``node down`` to the ``hloserve`` subcommands."""
    node = commands.add_parser(
        "node",
        help="one tritonserver per GPU (processes or containers) plus the gateway",
        description="Start or stop the workers of this machine from a node file "
        "(docs/deployment.md); settings can be overridden with HLOSERVE_NODE_* variables.",
    )
    actions = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    for action, text in (
        ("up", "start the workers and the gateway; stop everything on Ctrl-C/SIGTERM"),
        ("down", "stop the node: remove its containers (by label) or end its `node up`"),
    ):
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument(
            "--config",
            type=Path,
            default=None,
            metavar="FILE",
            help="node YAML file (default: HLOSERVE_NODE_* variables only)",
        )
        sub.set_defaults(func=_node)
