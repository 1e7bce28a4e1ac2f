"""Export ``simple``: the model Triton's own client examples call, as a bundle from JAX.

    python examples/triton_simple/export.py --out bundles

Like Triton's ``simple`` (triton-inference-server/client, ``src/python/examples``:
``simple_grpc_infer_client.py`` and most others drive it): INT32 inputs ``INPUT0`` and
``INPUT1`` of ``[batch, 16]``, outputs ``OUTPUT0 = INPUT0 + INPUT1`` and
``OUTPUT1 = INPUT0 - INPUT1``. Compiled batch sizes 1 and 8 (Triton's ``simple`` has
``max_batch_size: 8``). docs/conformance.md lists the examples that run unchanged against it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.export import OutputSpec, TensorSpec, export_bundle

BATCH_SIZES = (1, 8)


def add_sub(params: Any, input0: Any, input1: Any) -> tuple[Any, Any]:
    """``(OUTPUT0, OUTPUT1)``: the sum and the difference, INT32 ``[batch, 16]``."""
    return input0 + input1 + params["zero"], input0 - input1


def export_simple(bundles_dir: Path, name: str = "simple") -> Path:
    """Write ``bundles_dir/<name>``; returns the bundle path."""
    spec: dict[str, Any] = {"dtype": "i32", "shape": "nk", "dims": {"k": 16}}
    out = bundles_dir / name
    export_bundle(
        add_sub,
        {"zero": np.zeros((16,), np.int32)},
        [TensorSpec(name="INPUT0", **spec), TensorSpec(name="INPUT1", **spec)],
        [OutputSpec("OUTPUT0", "nk"), OutputSpec("OUTPUT1", "nk")],
        list(BATCH_SIZES),
        out,
        overwrite=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bundles"), help="bundles directory")
    print(export_simple(parser.parse_args().out))


if __name__ == "__main__":
    main()
