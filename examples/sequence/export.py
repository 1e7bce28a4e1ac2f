"""Export ``simple_sequence``: Triton's sequence example model, as a stateful bundle from JAX.

    python examples/sequence/export.py --out bundles

Like Triton's ``simple_sequence`` (the model its ``simple_grpc_sequence_sync_infer_client.py``
drives): client input ``INPUT`` and output ``OUTPUT``, INT32 ``[batch, 1]``; a sequence's first
request is answered with its input plus 1, every later one with its input. Whether the sequence
has been seen is the bundle's state (``SEEN`` in, ``SEEN_NEXT`` out, INT32 ``[batch, 1]``;
docs/bundles.md, "Stateful bundles"): the runtime starts it at 0 at START and keeps it per
sequence, so interleaved sequences each get the +1 on their own first request only. Compiled
batch sizes 1, 8: requests of different sequences run together, one row each.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle.manifest_sections import StateSpec
from hloserve.export import OutputSpec, TensorSpec, export_bundle

BATCH_SIZES = (1, 8)


def step(params: Any, seen: Any, value: Any) -> tuple[Any, Any]:
    """``(OUTPUT, SEEN_NEXT)``: ``INPUT + 1`` while ``SEEN`` is 0 (START), else ``INPUT``; 1."""
    return value + (1 - seen) + params["zero"], seen * 0 + 1


def export_sequence(bundles_dir: Path, name: str = "simple_sequence") -> Path:
    """Write ``bundles_dir/<name>``; returns the bundle path."""
    spec: dict[str, Any] = {"dtype": "i32", "shape": "nk", "dims": {"k": 1}}
    out = bundles_dir / name
    export_bundle(
        step,
        {"zero": np.zeros((1,), np.int32)},
        [TensorSpec(name="SEEN", **spec), TensorSpec(name="INPUT", **spec)],
        [OutputSpec("OUTPUT", "nk"), OutputSpec("SEEN_NEXT", "nk")],
        list(BATCH_SIZES),
        out,
        overwrite=True,
        state=[StateSpec(input="SEEN", output="SEEN_NEXT")],
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bundles"), help="bundles directory")
    print(export_sequence(parser.parse_args().out))


if __name__ == "__main__":
    main()
