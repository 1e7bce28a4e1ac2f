"""``python -m hloserve.observability dashboards --out DIR [--check]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    """Write the dashboards' JSON into ``--out``, or with ``--check`` report drift (exit 1)."""
    parser = argparse.ArgumentParser(
        prog="python -m hloserve.observability",
        description="Generate hloserve's Grafana dashboards (needs grafana-foundation-sdk).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    boards = commands.add_parser("dashboards", help="write or check the dashboards' JSON")
    boards.add_argument(
        "--out", type=Path, default=Path("containers/grafana/dashboards"), metavar="DIR"
    )
    boards.add_argument(
        "--check", action="store_true", help="exit 1 when a file differs from the code"
    )
    args = parser.parse_args(argv)
    from hloserve.observability.dashboards import drift, write_dashboards

    if args.check:
        problems = drift(args.out)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("regenerate: python -m hloserve.observability dashboards", file=sys.stderr)
            return 1
        print(f"{args.out}: dashboards up to date")
        return 0
    for path in write_dashboards(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
