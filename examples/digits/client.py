"""Classify the held-out digits split through a running server, over gRPC and HTTP.

    python examples/digits/client.py [--grpc localhost:8001] [--http localhost:8000]

Uses stock tritonclient (KServe V2). Prints accuracy per protocol; exits 1 if the two disagree
or accuracy is under 0.95.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import digits_model

MIN_ACCURACY = 0.95


def classify(client: Any, module: Any, images: np.ndarray, batch: int, model: str) -> np.ndarray:
    """Logits f32 (n, 10) for images f32 (n, 8, 8, 1), ``batch`` images per request."""
    out = []
    for start in range(0, len(images), batch):
        chunk = np.ascontiguousarray(images[start : start + batch])
        tensor = module.InferInput("image", list(chunk.shape), "FP32")
        tensor.set_data_from_numpy(chunk)
        result = client.infer(model, [tensor], outputs=[module.InferRequestedOutput("logits")])
        out.append(result.as_numpy("logits"))
    return np.concatenate(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc", default="localhost:8001", help="gRPC endpoint host:port")
    parser.add_argument("--http", default="localhost:8000", help="HTTP endpoint host:port")
    parser.add_argument("--model", default="digits")
    parser.add_argument("--batch", type=int, default=8, help="images per request")
    args = parser.parse_args()

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    _, _, images, labels = digits_model.load_split()
    results = {}
    for name, module, url in (("gRPC", grpcclient, args.grpc), ("HTTP", httpclient, args.http)):
        client = module.InferenceServerClient(url)
        start = time.perf_counter()
        logits = classify(client, module, images, args.batch, args.model)
        seconds = time.perf_counter() - start
        acc = digits_model.accuracy(logits, labels)
        results[name] = logits.argmax(1)
        print(
            f"{name:4}: accuracy {acc:.4f} on {len(images)} held-out images "
            f"({len(images) / seconds:.0f} images/s, batch {args.batch})"
        )
        if acc < MIN_ACCURACY:
            print(f"{name}: accuracy under {MIN_ACCURACY}", file=sys.stderr)
            return 1
    if not np.array_equal(results["gRPC"], results["HTTP"]):
        print("gRPC and HTTP predictions differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
