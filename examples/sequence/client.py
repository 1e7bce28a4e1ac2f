"""Two interleaved sequences through a running server, as Triton's sequence examples do.

    python examples/sequence/client.py [--grpc localhost:8001] [--model simple_sequence]

After Triton's ``simple_grpc_sequence_sync_infer_client.py``: sequences 1000 and 1001 and one
with a string ID (a UUID, as Triton's example's third sequence) send their values one request at
a time, interleaved (``sequence_id``, ``sequence_start`` on the first, ``sequence_end`` on the
last); each answer is that sequence's running sum. Exits 1 on a wrong sum.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

import numpy as np

VALUES = (11, 7, 5, 3, 2, 0, 1)


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
    """The three sequences' answers, step by step: ``[(sum of 1000, sum of 1001, sum of the
    UUID's sequence), ...]``; the UUID's sequence sends twice the values.

    Raises:
        AssertionError: an answer is not its sequence's running sum.
    """
    import tritonclient.grpc as grpcclient

    key = str(uuid.uuid4())
    answers = []
    with grpcclient.InferenceServerClient(url) as client:
        for i, value in enumerate(VALUES):
            first, last = i == 0, i == len(VALUES) - 1
            a = send(client, model, 1000, value, first, last)
            b = send(client, model, 1001, -value, first, last)
            c = send(client, model, key, 2 * value, first, last)
            expected = sum(VALUES[: i + 1])
            assert (a, b, c) == (expected, -expected, 2 * expected), (i, a, b, c, expected)
            answers.append((a, b, c))
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
