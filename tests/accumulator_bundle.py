"""The ``accumulator`` test bundle: a stateful model whose state is the running sum of a sequence.

State ``s`` (f32 ``[batch, 4]``) and client input ``x`` (f32 ``[batch, 4]``): the executable
returns ``y = s + x`` to the client and ``s + x`` as the new state, so a sequence that sends
1, 2, 3 receives 1, 3, 6 (Triton's sequence examples expect the same of their accumulators).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BATCH_SIZES = [1, 8]
WIDTH = 4
#: Bytes of one sequence's state (f32 x WIDTH).
STATE_BYTES = 4 * WIDTH


def accumulate(params: Any, s: Any, x: Any) -> Any:
    total = s + x + params["zero"]
    return total, total


def export_accumulator(
    out_dir: Path, batch_sizes: list[int] = BATCH_SIZES, sequence: Any = None
) -> Path:
    """Export the bundle from JAX to ``out_dir`` (its name is the model name); ``sequence``: its
    manifest's ``sequence`` section (a ``Sequencing``), None for the defaults."""
    import numpy as np

    from hloserve.bundle.manifest_sections import StateSpec, TensorSpec
    from hloserve.export._export import OutputSpec, export_bundle

    spec = {"dtype": "f32", "shape": "nk", "dims": {"k": WIDTH}}
    export_bundle(
        accumulate,
        {"zero": np.zeros((WIDTH,), np.float32)},
        [TensorSpec(name="s", **spec), TensorSpec(name="x", **spec)],  # type: ignore[arg-type]
        [OutputSpec("y", "nk"), OutputSpec("s_next", "nk")],
        batch_sizes,
        out_dir,
        overwrite=True,
        state=[StateSpec(input="s", output="s_next")],
        sequence=sequence,
    )
    return out_dir


def infer_step(
    client: Any, sequence: int | str, value: float, start: bool = False, end: bool = False
) -> float:
    """One step of a sequence: ``x`` filled with ``value`` sent to ``accumulator`` over gRPC
    (``client``: a tritonclient.grpc client); returns ``y[0, 0]`` (the running sum)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    x = np.full((1, WIDTH), value, np.float32)
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(
        "accumulator",
        [tensor],
        sequence_id=sequence,
        sequence_start=start,
        sequence_end=end,
        client_timeout=60,
    )
    return float(result.as_numpy("y")[0, 0])
