"""The ``echo`` test bundle: BYTES in, the same BYTES out, through hooks, variants and the runtime.

Client input ``blob`` (BYTES ``[batch]``) -> ``preprocess`` packs each element into a zero-padded
u8 row plus its length -> the executable returns both unchanged (``data + 0``) at a variant of
``l`` (8 or 64 bytes) -> ``postprocess`` rebuilds each element from its row and length -> client
output ``blob`` (BYTES). A byte-exact round trip proves the BYTES path, the hooks, the variant
choice and the padding and slicing of a variable axis at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VARIANTS = [{"l": 8}, {"l": 64}]
BATCH_SIZES = [1, 8]

HOOKS = """
import numpy as np


def preprocess(inputs):
    items = [bytes(b) for b in inputs["blob"].reshape(-1)]
    width = max(1, max(len(b) for b in items))
    data = np.zeros((len(items), width), np.uint8)
    for row, item in enumerate(items):
        data[row, : len(item)] = np.frombuffer(item, np.uint8)
    return {"data": data, "length": np.array([len(b) for b in items], np.int32)}


def postprocess(outputs):
    rows = zip(outputs["data"], outputs["length"], strict=True)
    return {"blob": np.array([row[:n].tobytes() for row, n in rows], dtype=object)}
"""


def echo(params: Any, data: Any, length: Any) -> Any:
    return data + 0, length + 0


def export_echo(out: Path) -> Path:
    """Write the echo bundle at ``out`` (its directory name is the model name)."""
    from hloserve.export import ClientTensorSpec, OutputSpec, TensorSpec, export_bundle

    hooks = out.parent / f".{out.name}.model.py"
    hooks.parent.mkdir(parents=True, exist_ok=True)
    hooks.write_text(HOOKS)
    blob = ClientTensorSpec(name="blob", dtype="bytes", shape="n")
    export_bundle(
        echo,
        {},
        [
            TensorSpec(name="data", dtype="u8", shape="nl", dims={"l": -1}),
            TensorSpec(name="length", dtype="i32", shape="n"),
        ],
        [OutputSpec("data", "nl"), OutputSpec("length", "n")],
        BATCH_SIZES,
        out,
        variants=VARIANTS,
        client_inputs=[blob],
        client_outputs=[blob],
        files={"model.py": hooks},
    )
    hooks.unlink()
    return out
