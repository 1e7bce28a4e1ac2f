"""The build options: :class:`BuildOptions`, every option that shapes the repository built
from bundles, with its parts (docs/serving.md, "Build options").

``hloserve repo build`` and ``hloserve serve`` make one :class:`BuildOptions` from their flags
(:func:`hloserve.cli_options.build_options`) and pass it whole to
:func:`~hloserve.model_repository_tools.repository_plan.plan_repository`. Each field's metadata
names its flag; a scalar field with a help text is also where its flag is declared. This module
imports nothing heavy: the CLI reads it to add the flags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from hloserve import names
from hloserve.errors import RepositoryError


def _flag(flag: str, metavar: str = "", text: str = "") -> dict[str, str]:
    """A field's command-line flag; with ``text`` (its help: ``{when}`` and ``{default}`` are
    filled in) :func:`hloserve.cli_options.add_build_options` adds the flag from the field."""
    return {"flag": flag, "metavar": metavar, "help": text}


@dataclass(frozen=True, kw_only=True)
class WeightCacheOptions:
    """The runtime's weight cache settings, written to its config (docs/on_demand_weights.md).

    Attributes:
        weight_cache_bytes: byte budget for all weights (pinned included); 0 (default) = no
            budget, every model's weights stay on the device.
        weight_cache_fraction: instead of bytes, the budget as a fraction in (0, 1] of the
            device memory free at the runtime's start; 0 (default) = unused.
        device_memory_fraction: the fraction in (0, 1] of the card's memory the runtime's
            allocator may take; 0 (default) = ``names.DEFAULT_DEVICE_MEMORY_FRACTION``.
        residency: model name -> ``"system"`` (default), ``"device"`` or ``"unpinned"``.
        compaction_interval: on-demand loads between compactions; 0 (default) = off.
    """

    weight_cache_bytes: int = field(default=0, metadata=_flag("--weight-cache-bytes"))
    weight_cache_fraction: float = field(default=0.0, metadata=_flag("--weight-cache-fraction"))
    device_memory_fraction: float = field(default=0.0, metadata=_flag("--device-memory-fraction"))
    residency: Mapping[str, str] = field(default_factory=dict, metadata=_flag("--residency"))
    compaction_interval: int = field(default=0, metadata=_flag("--compaction-interval"))


@dataclass(frozen=True, kw_only=True)
class SchedulingOptions:
    """The runtime scheduler's settings, written to its config (docs/scheduling.md).

    Attributes:
        scheduling: ``"fair"`` (default), ``"fifo"`` or ``"edf"``.
        model_weights: model name -> ``fair`` weight (> 0); unlisted models weigh 1.0.
    """

    scheduling: str = field(default=names.SCHEDULING_DISCIPLINES[0], metadata=_flag("--scheduling"))
    model_weights: Mapping[str, float] = field(
        default_factory=dict, metadata=_flag("--model-weight")
    )


@dataclass(frozen=True, kw_only=True)
class ExecutableCacheOptions:
    """The runtime's executable cache settings, written to its config (docs/serving.md,
    "Executable cache").

    Attributes:
        directory: the cache directory (absolute) or ``"off"``; "" (default) = the runtime's
            default (``HLOSERVE_EXECUTABLE_CACHE``, else ``$XDG_CACHE_HOME/hloserve/executables``).
        max_bytes: the size bound in bytes; 0 (default) = the runtime's default (4 GiB).
    """

    directory: str = field(default="", metadata=_flag("--executable-cache"))
    max_bytes: int = field(default=0, metadata=_flag("--executable-cache-bytes"))


@dataclass(frozen=True, kw_only=True)
class QueueOptions:
    """Bounds of Triton's queue in front of each front model, written to its config
    (docs/serving.md, "Queue bounds and deadlines").

    Attributes:
        max_queue_size: requests a front's queue holds before Triton refuses more with
            UNAVAILABLE "Exceeds maximum queue size"; 0 (default) =
            :data:`~hloserve.names.DEFAULT_QUEUE_BATCHES` x the model's largest batch size, at
            least :data:`~hloserve.names.DEFAULT_QUEUE_MIN`.
        per_model: model name -> its own bound (>= 1), over ``max_queue_size``.
    """

    max_queue_size: int = field(default=0, metadata=_flag("--max-queue-size"))
    per_model: Mapping[str, int] = field(default_factory=dict, metadata=_flag("--max-queue-size"))

    def check(self, fronts: Sequence[str]) -> None:
        """Refuse a negative bound, a per-model bound below 1 or for a model not in ``fronts``.

        Raises:
            RepositoryError: every problem, naming the model.
        """
        problems = []
        if self.max_queue_size < 0:
            problems.append(f"max queue size must be >= 0 (0 = default), got {self.max_queue_size}")
        for model, size in sorted(self.per_model.items()):
            if size < 1:
                problems.append(f"max queue size of model {model!r} must be >= 1, got {size}")
            if model not in fronts:
                problems.append(
                    f"max queue size for {model!r}, which is not a bundle with a queue; those "
                    f"are {sorted(fronts)}"
                )
        if problems:
            raise RepositoryError("; ".join(problems))


@dataclass(frozen=True, kw_only=True)
class BatchSizeOptions:
    """``--batch-sizes``: compiled batch sizes for the symbolic-batch bundles of a repository.

    Attributes:
        default: sizes for every symbolic bundle not in ``per_model``; empty = the default
            ladder (:func:`default_batch_sizes`).
        per_model: model name -> its sizes.
    """

    default: tuple[int, ...] = field(default=(), metadata={"flag": "--batch-sizes"})
    per_model: Mapping[str, tuple[int, ...]] = field(
        default_factory=dict, metadata={"flag": "--batch-sizes"}
    )


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Every option that shapes the repository built from bundles: the one value that
    ``hloserve repo build`` and ``hloserve serve`` pass whole to :func:`plan_repository`
    (docs/serving.md, "Build options").

    Each field's metadata names its flag; a scalar field with a help text gets its flag from
    :func:`hloserve.cli_options.add_build_options` as it is declared here.

    Attributes:
        front_instances: CPU instances per front model (``instance_group.count``), >= 1.
        meta_concurrency: the worker's meta gate size (docs/meta_models.md), >= 1.
        max_queue_delay_us: dynamic batcher ``max_queue_delay_microseconds``, >= 0.
        max_request_bytes: the largest request a front accepts, bytes of its input tensors,
            >= 1 (``hloserve.max_request_bytes``).
        batch_sizes: compiled batch sizes of the symbolic-batch bundles
            (:mod:`hloserve.model_repository_tools.batch_sizes`; default: each one's ladder).
        weight_cache: the runtime's weight cache settings (default: no budget).
        scheduling: the runtime scheduler's settings (default: ``fair``, all weights 1.0).
        executable_cache: the runtime's executable cache settings (default: its defaults).
        queue: the bounds of Triton's queue in front of each front (default: each sized from
            its model's largest batch).
    """

    front_instances: int = field(
        default=names.DEFAULT_FRONT_INSTANCES,
        metadata=_flag(
            "--front-instances", "N", "CPU instances of each front model{when} (default: {default})"
        ),
    )
    meta_concurrency: int = field(
        default=names.DEFAULT_META_CONCURRENCY,
        metadata=_flag(
            "--meta-concurrency",
            "N",
            "meta model runs at once on the worker, across all metas{when} (default: {default}; "
            "docs/meta_models.md)",
        ),
    )
    max_queue_delay_us: int = field(
        default=500,
        metadata=_flag(
            "--max-queue-delay-us",
            "US",
            "dynamic batcher max_queue_delay_microseconds{when} (default: {default})",
        ),
    )
    max_request_bytes: int = field(
        default=names.DEFAULT_MAX_REQUEST_BYTES,
        metadata=_flag(
            "--max-request-bytes",
            "N",
            "largest request a front model accepts{when}, bytes of its input tensors; a larger "
            "one gets INVALID_ARGUMENT naming the limit (default: {default} = 1 GiB; "
            "docs/serving.md)",
        ),
    )
    batch_sizes: BatchSizeOptions = field(default_factory=BatchSizeOptions)
    weight_cache: WeightCacheOptions = field(default_factory=WeightCacheOptions)
    scheduling: SchedulingOptions = field(default_factory=SchedulingOptions)
    executable_cache: ExecutableCacheOptions = field(default_factory=ExecutableCacheOptions)
    queue: QueueOptions = field(default_factory=QueueOptions)

    def flags_set(self) -> list[str]:
        """The flags whose values differ from their defaults, in command-line spelling and
        declaration order (a flag set to its default value is not reported)."""
        flags: list[str] = []

        def walk(value: object, default: object) -> None:
            for f in fields(value):  # type: ignore[arg-type]
                mine, theirs = getattr(value, f.name), getattr(default, f.name)
                if is_dataclass(mine):
                    walk(mine, theirs)
                elif mine != theirs and f.metadata["flag"] not in flags:
                    flags.append(f.metadata["flag"])

        walk(self, BuildOptions())
        return flags

    def runtime_settings(self) -> dict[str, Any]:
        """The runtime model's settings, by ``RuntimeParameters`` field name: the keyword
        arguments of :func:`~hloserve.model_repository_tools.config.runtime_config`."""
        return {
            **{f.name: getattr(self.weight_cache, f.name) for f in fields(self.weight_cache)},
            **{f.name: getattr(self.scheduling, f.name) for f in fields(self.scheduling)},
            "executable_cache": self.executable_cache.directory,
            "executable_cache_bytes": self.executable_cache.max_bytes,
        }

    def check(self) -> None:
        """Refuse scalar options out of range.

        Raises:
            RepositoryError: the first one, naming it and its value.
        """
        if self.front_instances < 1:
            raise RepositoryError(f"front instances must be >= 1, got {self.front_instances}")
        if self.max_queue_delay_us < 0:
            raise RepositoryError(
                f"max queue delay must be >= 0 microseconds, got {self.max_queue_delay_us}"
            )
        if self.meta_concurrency < 1:
            raise RepositoryError(f"meta concurrency must be >= 1, got {self.meta_concurrency}")
        if self.max_request_bytes < 1:
            raise RepositoryError(f"max request bytes must be >= 1, got {self.max_request_bytes}")
