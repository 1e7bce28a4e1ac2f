"""The build options: :class:`BuildOptions` and its parts (docs/serving.md, "Build options").

Each field's metadata names its command-line flag; light to import (the CLI reads it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from hloserve import names
from hloserve.errors import RepositoryError


def _flag(flag: str, metavar: str = "", text: str = "") -> dict[str, str]:
    """Field metadata; with help ``text`` the CLI declares the flag from the field."""
    return {"flag": flag, "metavar": metavar, "help": text}


@dataclass(frozen=True, kw_only=True)
class WeightCacheOptions:
    """The runtime's weight cache settings (docs/on_demand_weights.md; the fields of
    :class:`~hloserve.model_parameters.RuntimeParameters` of the same names)."""

    weight_cache_bytes: int = field(default=0, metadata=_flag("--weight-cache-bytes"))
    weight_cache_fraction: float = field(default=0.0, metadata=_flag("--weight-cache-fraction"))
    device_memory_fraction: float = field(default=0.0, metadata=_flag("--device-memory-fraction"))
    residency: Mapping[str, str] = field(default_factory=dict, metadata=_flag("--residency"))
    compaction_interval: int = field(default=0, metadata=_flag("--compaction-interval"))


@dataclass(frozen=True, kw_only=True)
class SchedulingOptions:
    """The runtime scheduler's discipline and ``fair`` weights (docs/scheduling.md)."""

    scheduling: str = field(default=names.SCHEDULING_DISCIPLINES[0], metadata=_flag("--scheduling"))
    model_weights: Mapping[str, float] = field(
        default_factory=dict, metadata=_flag("--model-weight")
    )


@dataclass(frozen=True, kw_only=True)
class ExecutableCacheOptions:
    """The runtime's executable cache: an absolute ``directory`` or ``"off"`` and ``max_bytes``;
    ""/0 = the runtime's defaults (docs/serving.md, "Executable cache")."""

    directory: str = field(default="", metadata=_flag("--executable-cache"))
    max_bytes: int = field(default=0, metadata=_flag("--executable-cache-bytes"))


@dataclass(frozen=True, kw_only=True)
class QueueOptions:
    """Bounds of Triton's queue before each front, in requests; 0 = the default (sized from the
    largest batch on fronts of two instances or more; none on one instance, the default
    instance count); ``per_model`` overrides (docs/serving.md, "Queue bounds and deadlines")."""

    max_queue_size: int = field(default=0, metadata=_flag("--max-queue-size"))
    per_model: Mapping[str, int] = field(default_factory=dict, metadata=_flag("--max-queue-size"))

    def check(self, fronts: Sequence[str]) -> None:
        """RepositoryError for a negative bound, a per-model one below 1 or not in ``fronts``."""
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
    """``--batch-sizes``: compiled sizes of symbolic-batch bundles; ``default`` empty = each
    one's ladder (:func:`~hloserve.model_repository_tools.batch_sizes.default_batch_sizes`)."""

    default: tuple[int, ...] = field(default=(), metadata={"flag": "--batch-sizes"})
    per_model: Mapping[str, tuple[int, ...]] = field(
        default_factory=dict, metadata={"flag": "--batch-sizes"}
    )


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Every option that shapes the repository built from bundles (docs/serving.md, "Build
    options"); the scalar fields' help texts are their flags' help."""

    front_instances: int = field(
        default=0,
        metadata=_flag(
            "--front-instances",
            "N",
            "CPU instances of each front model{when} (default: "
            f"{names.DEFAULT_FRONT_INSTANCES}, {names.STATEFUL_FRONT_INSTANCES} for a stateful "
            "model; a front of one instance gets no queue bound unless --max-queue-size asks, "
            "where tritonserver 2.51 would hold requests ~500 ms at times)",
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
        """The flags whose values differ from their defaults, in declaration order."""
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
        """The runtime model's settings as ``RuntimeParameters`` keyword arguments."""
        return {
            **{f.name: getattr(self.weight_cache, f.name) for f in fields(self.weight_cache)},
            **{f.name: getattr(self.scheduling, f.name) for f in fields(self.scheduling)},
            "executable_cache": self.executable_cache.directory,
            "executable_cache_bytes": self.executable_cache.max_bytes,
        }

    def check(self) -> None:
        """RepositoryError naming the first scalar option out of range."""
        if self.front_instances < 0:
            raise RepositoryError(
                f"front instances must be >= 0 (0 = default), got {self.front_instances}"
            )
        if self.max_queue_delay_us < 0:
            raise RepositoryError(
                f"max queue delay must be >= 0 microseconds, got {self.max_queue_delay_us}"
            )
        if self.meta_concurrency < 1:
            raise RepositoryError(f"meta concurrency must be >= 1, got {self.meta_concurrency}")
        if self.max_request_bytes < 1:
            raise RepositoryError(f"max request bytes must be >= 1, got {self.max_request_bytes}")
