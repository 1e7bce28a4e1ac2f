"""Two interleaved sequences through a running server, as Triton's sequence examples do.

    python examples/sequence/client.py [--grpc localhost:8001] [--model simple_sequence]

After Triton's ``simple_grpc_sequence_sync_infer_client.py``: sequences 1000 and 1001 and one
with a string ID (a UUID, as Triton's example's third sequence) send ``[first] + values`` one
request at a time, interleaved (``sequence_id``, ``sequence_start`` on the first,
``sequence_end`` on the last), 1001 and the UUID's sequence with the values negated. As Triton's
``simple_sequence`` does, each sequence's first request is answered with its input plus 1
(0 -> 1, 100 -> 101, 20 -> 21) and every later one with its input. Exits 1 on a wrong answer.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

import numpy as np

VALUES = (11, 7, 5, 3, 2, 0, 1)
FIRST = (0, 100, 20)  # the first input of sequence 1000, 1001 and the UUID's, as Triton's


def send(client: Any, model: str, sequence: int | str, value: int, start: bool, end: bool) -> int:
    """One request of a sequence; its ``OUTPUT``."""
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
    result = client.infer(
        model, [tensor], sequence_id=sequence, sequence_start=start, sequence_end=end
    )
    return int(result.as_numpy("OUTPUT")[0, 0])


def run(url: str, model: str = "simple_sequence") -> list[tuple[int, int, int]]:
    """The three sequences' answers, step by step: ``[(answer of 1000, of 1001, of the UUID's
    sequence), ...]``, ``len(VALUES) + 1`` steps; step 0 is ``FIRST`` plus 1, step ``i`` is
    ``VALUES[i - 1]`` (negated for 1001 and the UUID's sequence).

    Raises:
        AssertionError: an answer is not the expected one (step, answers, expected).
    """
    import tritonclient.grpc as grpcclient

    key = str(uuid.uuid4())
    answers = []
    with grpcclient.InferenceServerClient(url) as client:
        steps = [FIRST, *((v, -v, -v) for v in VALUES)]
        for i, (x, y, z) in enumerate(steps):
            first, last = i == 0, i == len(steps) - 1
            got = (
                send(client, model, 1000, x, first, last),
                send(client, model, 1001, y, first, last),
                send(client, model, key, z, first, last),
            )
            expected = (x + 1, y + 1, z + 1) if first else (x, y, z)
            assert got == expected, (i, got, expected)
            answers.append(got)
    return answers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc", default="localhost:8001", help="gRPC endpoint host:port")
    parser.add_argument("--model", default="simple_sequence")
    args = parser.parse_args()
    try:
        answers = run(args.grpc, args.model)
    except AssertionError as exc:
        print(f"FAIL: {exc}")
        return 1
    for a, b, c in answers:
        print(f"sequence 1000: {a:4}   sequence 1001: {b:4}   string sequence: {c:4}")
    print("PASS: sequence")
    return 0


if __name__ == "__main__":
    sys.exit(main())
