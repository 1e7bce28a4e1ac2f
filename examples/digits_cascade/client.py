"""Classify the held-out digits split with the cascade, over gRPC and HTTP, and check it.

    python examples/digits_cascade/client.py [--grpc localhost:8001] [--http localhost:8000]

For each protocol: calls ``digits_cascade`` (the meta), then ``digits_fast`` and ``digits``
directly and applies the cascade's rule here. Prints the accuracy of each model alone, of the
cascade, and the fraction escalated. Exits 1 if the meta's labels differ from the client-side
rule, or if the cascade is less accurate than the fast model alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "digits"))

import digits_model

HERE = Path(__file__).resolve().parent


def cascade_rule() -> Any:
    """The meta's own ``model.py`` (its THRESHOLD and ``top1``), imported from the example."""
    spec = importlib.util.spec_from_file_location(
        "cascade_rule", HERE / "digits_cascade" / "model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def infer(
    client: Any, module: Any, model: str, images: np.ndarray, outputs: list[str]
) -> list[np.ndarray]:
    """One request of ``images`` f32 (n, 8, 8, 1) to ``model``; the named outputs."""
    tensor = module.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(images))
    result = client.infer(
        model, [tensor], outputs=[module.InferRequestedOutput(n) for n in outputs]
    )
    return [result.as_numpy(n) for n in outputs]


def run_protocol(client: Any, module: Any, images: np.ndarray, batch: int) -> dict[str, np.ndarray]:
    """Labels of the cascade (meta), its stages, and the client-side rule over both models."""
    rule = cascade_rule()
    labels, stages, fast, strong = [], [], [], []
    for start in range(0, len(images), batch):
        chunk = images[start : start + batch]
        label, stage = infer(client, module, "digits_cascade", chunk, ["label", "stage"])
        labels.append(label.reshape(-1))
        stages.append(stage.reshape(-1))
        fast.append(infer(client, module, "digits_fast", chunk, ["logits"])[0])
        strong.append(infer(client, module, "digits", chunk, ["logits"])[0])
    fast_logits, strong_logits = np.concatenate(fast), np.concatenate(strong)
    fast_label, confidence = rule.top1(fast_logits)
    unsure = confidence < rule.THRESHOLD
    expected = np.where(unsure, strong_logits.argmax(axis=1), fast_label)
    return {
        "label": np.concatenate(labels),
        "stage": np.concatenate(stages),
        "expected": expected,
        "expected_stage": np.where(unsure, b"strong", b"fast").astype(object),
        "fast": fast_label,
        "strong": strong_logits.argmax(axis=1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc", default="localhost:8001", help="gRPC endpoint host:port")
    parser.add_argument("--http", default="localhost:8000", help="HTTP endpoint host:port")
    parser.add_argument("--batch", type=int, default=8, help="images per request (<= 32)")
    args = parser.parse_args()

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    _, _, images, labels = digits_model.load_split()
    failed = False
    for name, module, url in (("gRPC", grpcclient, args.grpc), ("HTTP", httpclient, args.http)):
        start = time.perf_counter()
        r = run_protocol(module.InferenceServerClient(url), module, images, args.batch)
        seconds = time.perf_counter() - start
        acc = {k: float(np.mean(r[k] == labels)) for k in ("fast", "strong", "label")}
        escalated = float(np.mean(r["stage"] == b"strong"))
        same = bool(np.array_equal(r["label"], r["expected"]))
        same_stage = bool(np.array_equal(r["stage"], r["expected_stage"]))
        print(
            f"{name:4}: fast alone {acc['fast']:.4f}, strong alone {acc['strong']:.4f}, "
            f"cascade {acc['label']:.4f} with {escalated:.1%} escalated "
            f"({len(images)} images, {seconds:.1f} s for all three models); "
            f"meta = client-side rule: {same and same_stage}"
        )
        if not (same and same_stage) or acc["label"] < acc["fast"]:
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
