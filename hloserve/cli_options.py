"""Option groups shared by ``hloserve repo build``, ``serve`` and ``gateway``: ``add_*`` adds
a group's flags, its reader makes the typed value (InvalidArgumentError when malformed).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from hloserve import names
from hloserve.errors import InvalidArgumentError

if TYPE_CHECKING:
    import hloserve.model_repository_tools.build_options as typed


def add_weight_cache_options(parser: argparse.ArgumentParser) -> None:
    """--weight-cache-bytes, --residency, --compaction-interval (docs/on_demand_weights.md)."""
    parser.add_argument(
        "--weight-cache-bytes",
        type=int,
        default=0,
        metavar="N",
        help="byte budget of the runtime's device weight cache, pinned models included "
        "(default: 0 = sized from the card: what --device-memory-fraction allows less the "
        "executables, the largest scratch and a 10%% margin; no budget on CPU); "
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
        "--device-memory-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="the fraction in (0, 1] of the card's memory the runtime's JAX allocator may take "
        f"(default {names.DEFAULT_DEVICE_MEMORY_FRACTION}: room for tritonserver's CUDA "
        "context and pools); no preallocation; docs/on_demand_weights.md",
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


def weight_cache_options(args: argparse.Namespace) -> typed.WeightCacheOptions:
    """The ``WeightCacheOptions`` of :func:`add_weight_cache_options`'s arguments; a malformed
    ``--residency`` raises InvalidArgumentError."""
    from hloserve.model_repository_tools.build_options import WeightCacheOptions
    from hloserve.names import parse_residency

    try:
        residency = parse_residency(",".join(args.residency))
    except ValueError as exc:
        raise InvalidArgumentError(f"--residency: {exc}") from None
    return WeightCacheOptions(
        weight_cache_bytes=args.weight_cache_bytes,
        weight_cache_fraction=args.weight_cache_fraction,
        device_memory_fraction=args.device_memory_fraction,
        residency=residency,
        compaction_interval=args.compaction_interval,
    )


def add_build_options(parser: argparse.ArgumentParser, when: str = "") -> None:
    """Every flag that shapes the repository built from bundles (docs/serving.md, "Build
    options"); ``when`` fills the help's ``{when}`` (``" when building"`` for ``serve``)."""
    from hloserve.model_repository_tools.build_options import BuildOptions

    for f in dataclasses.fields(BuildOptions):
        if f.metadata.get("help"):
            parser.add_argument(
                f.metadata["flag"],
                type=type(f.default),
                default=f.default,
                metavar=f.metadata["metavar"],
                help=f.metadata["help"].format(when=when, default=f.default),
            )
    parser.add_argument(
        "--max-queue-size",
        action="append",
        default=[],
        metavar="[MODEL=]N",
        help=f"requests Triton's queue in front of each front model holds{when}; more are "
        "refused UNAVAILABLE 'Exceeds maximum queue size', and a request's KServe timeout "
        "expires it in the queue (default: "
        f"{names.DEFAULT_QUEUE_BATCHES} x the model's largest batch size, at least "
        f"{names.DEFAULT_QUEUE_MIN}, on fronts of {names.QUEUE_POLICY_MIN_INSTANCES} instances "
        "or more); MODEL=N for one "
        "model, repeatable; docs/serving.md",
    )
    add_weight_cache_options(parser)
    parser.add_argument(  # docs/bundles.md, "Symbolic batch"
        "--batch-sizes",
        action="append",
        default=[],
        metavar="[MODEL=]SIZES",
        help="compiled batch sizes of symbolic-batch bundles, e.g. 1,4,16,64 for all of them "
        "or MODEL=1,8 for one (repeatable); default: 1,4,16,64 within each bundle's "
        "constraints and 64 MiB of inputs+outputs per execution. A bundle exported with "
        "fixed batch sizes keeps them and refuses this flag",
    )
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
    parser.add_argument(  # docs/serving.md, "Executable cache"
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


def build_options(args: argparse.Namespace) -> typed.BuildOptions:
    """The ``BuildOptions`` of :func:`add_build_options`'s flags; raises InvalidArgumentError: a
    malformed --residency, --model-weight or --max-queue-size, a weight <= 0, or
    --executable-cache-bytes below 0."""
    import hloserve.model_repository_tools.build_options as typed
    from hloserve.model_repository_tools.batch_sizes import parse_batch_sizes
    from hloserve.names import EXECUTABLE_CACHE_OFF, parse_model_weights

    weight_cache = weight_cache_options(args)
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    try:
        weights = parse_model_weights(",".join(args.model_weight))
    except ValueError as exc:
        raise InvalidArgumentError(f"--model-weight: {exc}") from None
    if args.executable_cache_bytes < 0:
        raise InvalidArgumentError(
            f"--executable-cache-bytes must be >= 0, got {args.executable_cache_bytes}"
        )
    directory = args.executable_cache.strip()
    if directory.lower() == EXECUTABLE_CACHE_OFF:
        directory = EXECUTABLE_CACHE_OFF
    elif directory:
        directory = str(Path(directory).expanduser().absolute())
    scalars = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(typed.BuildOptions)
        if f.metadata.get("help")
    }
    return typed.BuildOptions(
        **scalars,
        weight_cache=weight_cache,
        batch_sizes=batch_sizes,
        scheduling=typed.SchedulingOptions(scheduling=args.scheduling, model_weights=weights),
        executable_cache=typed.ExecutableCacheOptions(
            directory=directory, max_bytes=args.executable_cache_bytes
        ),
        queue=queue_options(args.max_queue_size),
    )


def queue_options(values: list[str]) -> typed.QueueOptions:
    """The ``QueueOptions`` of repeated ``--max-queue-size`` values (``N`` or ``MODEL=N``).

    Raises:
        InvalidArgumentError: a value that is not an integer, or a default or model given twice.
    """
    from hloserve.model_repository_tools.build_options import QueueOptions

    default, per_model = 0, {}
    for value in values:
        model, sep, number = value.rpartition("=")
        try:
            size = int(number)
        except ValueError:
            raise InvalidArgumentError(f"--max-queue-size {value}: expected N or MODEL=N") from None
        if (sep and model in per_model) or (not sep and default):
            raise InvalidArgumentError(f"--max-queue-size {value}: given twice")
        if sep:
            per_model[model] = size
        else:
            default = size
    return QueueOptions(max_queue_size=default, per_model=per_model)


def add_tls_flags(parser: argparse.ArgumentParser, prefix: str) -> None:
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


def add_config_flag(parser: argparse.ArgumentParser, what: str, variables: str) -> None:
    """``--config FILE``: the YAML settings of ``gateway`` or ``node``."""
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"{what} YAML file (default: {variables} variables only)",
    )
