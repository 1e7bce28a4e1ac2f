"""A readable summary of a bundle: tensors, compiled batch sizes, executables, weight bytes."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from hloserve.bundle.bundle import Bundle
from hloserve.units import format_bytes


def _batching(bundle: Bundle) -> str:
    m = bundle.manifest
    symbolic = m.batching.symbolic
    if symbolic is None:
        return f"batch sizes {m.batching.compiled_batch_sizes or 'none (unbatched)'}"
    bounds = f"b >= {symbolic.min}" + (f", b <= {symbolic.max}" if symbolic.max else "")
    sizes = m.batching.compiled_batch_sizes
    chosen = f", compiled at {sizes}" if sizes else " (sizes chosen at repo build)"
    return f"symbolic batch ({bounds}){chosen}"


def render_bundle(bundle: Bundle) -> Group:
    """Rich renderables describing ``bundle`` (print them with a rich Console)."""
    m = bundle.manifest
    title = Text.assemble(
        (bundle.name, "bold"), f"  format v{m.format_version}, kind {m.kind}, ", _batching(bundle)
    )
    tensors = Table(title="tensors", title_justify="left")
    for col in ("role", "name", "dtype", "axes", "shape", "KServe", "bytes/item"):
        tensors.add_column(col)
    for role, specs in (
        ("input", m.inputs),
        ("output", m.outputs),
        ("client input", m.client_inputs or []),
        ("client output", m.client_outputs or []),
    ):
        for s in specs:
            shape = ["n" if i == s.batch_axis else str(d) for i, d in enumerate(s.shape_at(0))]
            cells = (
                role,
                s.name,
                s.dtype,
                s.shape,
                f"[{', '.join(shape)}]",
                s.dtype_info.kserve,
                "varies" if s.variable_axes or s.dtype == "bytes" else str(s.nbytes_per_item),
            )
            tensors.add_row(*(Text(c) for c in cells))  # Text: "[n, 8]" is not rich markup
    exes = Table(title="executables", title_justify="left")
    for col in (["variant"] if m.variants else []) + ["batch size", "file", "size"]:
        exes.add_column(col)
    files = m.all_executables
    if m.is_symbolic:  # one row per artifact, not per size it is specialized to
        files = {(v, -1): f for v, f in m.symbolic_executables.items()}
    for (variant, size), file in sorted(files.items()):
        path = bundle.path / file
        row = [
            "symbolic" if size < 0 else str(size) if size else "unbatched",
            file,
            format_bytes(path.stat().st_size) if path.exists() else "MISSING",
        ]
        if m.variants:
            row.insert(0, ", ".join(f"{a}={n}" for a, n in m.variant_dims[variant].items()))
        exes.add_row(*row)
    weights = Text(
        f"weights: {len(m.weights.order)} tensors, {format_bytes(bundle.weight_nbytes)}"
        + (f" in {m.weights.file}" if m.weights.file else "")
    )
    if m.is_meta:
        calls = Text(f"meta: calls {', '.join(m.calls) or 'nothing (compute-only)'}")
        return Group(title, tensors, calls)
    producer = Text("producer: " + ", ".join(f"{k} {v}" for k, v in m.producer.items()))
    return Group(title, tensors, exes, weights, producer)
