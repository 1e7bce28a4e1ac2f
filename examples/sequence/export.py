"""Export ``simple_sequence``: Triton's sequence example model, as a stateful bundle from JAX.

    python examples/sequence/export.py --out bundles

Like Triton's ``simple_sequence`` (the model its ``simple_grpc_sequence_sync_infer_client.py``
drives): client input ``INPUT`` and output ``OUTPUT``, INT32 ``[batch, 1]``; each sequence's
output is the running sum of its inputs, from 0 at START. The sum is the bundle's state
(``ACC`` in, ``ACC_NEXT`` out; docs/bundles.md, "Stateful bundles"). Compiled batch sizes 1, 8:
requests of different sequences run together, one row each.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle.manifest_sections import StateSpec
from hloserve.export import OutputSpec, TensorSpec, export_bundle

BATCH_SIZES = (1, 8)


def step(params: Any, acc: Any, value: Any) -> tuple[Any, Any]:
    """``(OUTPUT, ACC_NEXT)``: the running sum, twice (returned and carried)."""
    total = acc + value + params["zero"]
    return total, total


def export_sequence(bundles_dir: Path, name: str = "simple_sequence") -> Path:
    """Write ``bundles_dir/<name>``; returns the bundle path."""
    spec: dict[str, Any] = {"dtype": "i32", "shape": "nk", "dims": {"k": 1}}
    out = bundles_dir / name
    export_bundle(
        step,
        {"zero": np.zeros((1,), np.int32)},
        [TensorSpec(name="ACC", **spec), TensorSpec(name="INPUT", **spec)],
        [OutputSpec("OUTPUT", "nk"), OutputSpec("ACC_NEXT", "nk")],
        list(BATCH_SIZES),
        out,
        overwrite=True,
        state=[StateSpec(input="ACC", output="ACC_NEXT")],
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bundles"), help="bundles directory")
    print(export_sequence(parser.parse_args().out))


if __name__ == "__main__":
    main()
