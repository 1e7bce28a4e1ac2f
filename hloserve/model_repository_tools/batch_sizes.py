"""Compiled batch sizes of symbolic-batch bundles, chosen at build time (``--batch-sizes``;
docs/bundles.md, "Symbolic batch"). The build writes them into the repository's bundle copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hloserve.bundle.manifest import Manifest
from hloserve.errors import BatchSizeError
from hloserve.model_repository_tools.build_options import BatchSizeOptions

#: Sizes compiled for a symbolic bundle when ``--batch-sizes`` does not say (each 4x the last).
DEFAULT_LADDER = (1, 4, 16, 64)
#: The default ladder stops below the size whose inputs plus outputs per execution exceed this.
DEFAULT_LADDER_MAX_BYTES = 64 * 1024 * 1024


def parse_batch_sizes(values: Sequence[str]) -> BatchSizeOptions:
    """Parse repeated ``--batch-sizes`` values: ``1,4,16`` (every symbolic bundle) or ``M=1,8``.
    BatchSizeError for a size not a positive integer, a repeated size, a model named twice, or
    two default lists."""
    default: tuple[int, ...] = ()
    per_model: dict[str, tuple[int, ...]] = {}
    for value in values:
        model, sep, sizes_text = value.rpartition("=")
        sizes = _sizes(sizes_text, value)
        if not sep:
            if default:
                raise BatchSizeError(f"--batch-sizes {value}: the default sizes are given twice")
            default = sizes
        elif model in per_model:
            raise BatchSizeError(f"--batch-sizes {value}: model {model!r} is given twice")
        elif not model:
            raise BatchSizeError(f"--batch-sizes {value}: expected MODEL=SIZES or SIZES")
        else:
            per_model[model] = sizes
    return BatchSizeOptions(default=default, per_model=per_model)


def _sizes(text: str, value: str) -> tuple[int, ...]:
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise BatchSizeError(
            f"--batch-sizes {value}: expected comma-separated positive integers, e.g. 1,4,16"
        ) from None
    if any(s < 1 for s in sizes) or len(set(sizes)) != len(sizes):
        raise BatchSizeError(
            f"--batch-sizes {value}: sizes must be positive and distinct, got {sizes}"
        )
    return tuple(sorted(sizes))


def default_batch_sizes(manifest: Manifest) -> tuple[int, ...]:
    """:data:`DEFAULT_LADDER` within ``batching.symbolic`` and :data:`DEFAULT_LADDER_MAX_BYTES`
    (at the largest variant), plus ``min`` (never empty)."""
    symbolic = manifest.batching.symbolic
    assert symbolic is not None, "only symbolic-batch manifests have a default ladder"
    per_item = max(
        sum(
            math.prod(spec.shape_at(1, dims)) * spec.dtype_info.itemsize
            for spec in manifest.inputs + manifest.outputs
        )
        for dims in manifest.variant_dims
    )
    sizes = [
        s
        for s in DEFAULT_LADDER
        if symbolic.violation(s) is None and s * per_item <= DEFAULT_LADDER_MAX_BYTES
    ]
    return tuple(sorted({symbolic.min, *sizes}))


def choose_batch_sizes(
    manifests: Mapping[str, Manifest], options: BatchSizeOptions
) -> dict[str, tuple[int, ...]]:
    """Symbolic-batch model name -> its compiled sizes (sorted, checked); others keep theirs; raises
    BatchSizeError: a named model is not in the repository or has fixed batch sizes; sizes given for
    a repository without a symbolic bundle; a size that breaks a model's ``batching.symbolic``
    constraint (naming the model and the constraint)."""
    symbolic = {n: m for n, m in manifests.items() if m.is_symbolic}
    for name in options.per_model:
        if name not in manifests:
            raise BatchSizeError(
                f"--batch-sizes names model {name!r}, which is not among the bundles "
                f"{sorted(manifests)}"
            )
        if name not in symbolic:
            raise BatchSizeError(
                f"--batch-sizes {name}=...: model {name!r} has fixed compiled batch sizes "
                f"{manifests[name].batching.compiled_batch_sizes} (one artifact each); only a "
                "symbolic-batch bundle takes its sizes from the build"
            )
    if options.default and not symbolic:
        raise BatchSizeError(
            "--batch-sizes applies to symbolic-batch bundles, and none of "
            f"{sorted(manifests)} is one (each keeps the sizes it was exported with)"
        )
    chosen = {}
    for name, manifest in sorted(symbolic.items()):
        sizes = options.per_model.get(name) or options.default or default_batch_sizes(manifest)
        assert manifest.batching.symbolic is not None
        for size in sizes:
            broken = manifest.batching.symbolic.violation(size)
            if broken:
                raise BatchSizeError(
                    f"--batch-sizes: model {name!r} cannot compile batch size {size}: it breaks "
                    f"the bundle's symbolic batch constraint {broken}"
                )
        chosen[name] = tuple(sorted(sizes))
    return chosen
