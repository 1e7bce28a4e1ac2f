"""What the front model adds to a request: the golden affine through front + runtime vs the
runtime model called directly, side by side in one tritonserver.

    .venv/bin/python benchmarks/front_latency.py [--requests 300] [--rounds 3]

One client, gRPC, sequential batch-1 requests of the golden ``affine`` bundle (tests/golden):

(a) ``affine``: the front model (validation, coalescing, BLS) then the runtime model;
(b) ``hloserve_runtime`` with ``affine__x``: the runtime model alone, as the front calls it.

Each round sends ``--requests`` requests to (a), then to (b) (20 warm-up requests each first);
every answer is checked against the golden output. Prints mean / p50 / p99 milliseconds per path
(all rounds together) and the ratio a/b of the medians. The machine is noisy: read the ratio, not
the absolute numbers. Where the front's time goes: docs/serving.md ("Front -> runtime (BLS)").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(ROOT))


def _input(name: str, array: np.ndarray) -> Any:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="timed requests per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, paths alternating (3)")
    args = parser.parse_args(argv)

    import shutil

    import tritonclient.grpc as grpcclient

    from hloserve.model_repository_tools import build_repository
    from hloserve.node.serve import ServeOptions, server_options
    from hloserve.node.tritonserver import TritonServer, free_ports

    expected = np.load(GOLDEN / "affine.expected.npz")
    x, y = expected["x"][:1], expected["y"][:1]
    paths = {
        "(a) front + runtime (affine)": ("affine", "x", "y"),
        "(b) runtime alone (hloserve_runtime)": ("hloserve_runtime", "affine__x", "affine__y"),
    }
    times: dict[str, list[float]] = {label: [] for label in paths}
    with tempfile.TemporaryDirectory(prefix="hloserve-front-latency-") as tmp:
        bundles, repo = Path(tmp) / "bundles", Path(tmp) / "repository"
        shutil.copytree(GOLDEN / "affine", bundles / "affine")
        build_repository(bundles, repo)
        http, grpc, metrics = free_ports(3)
        options = ServeOptions(path=repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
        with (
            TritonServer(server_options(options, repo)) as server,
            grpcclient.InferenceServerClient(server.urls.grpc) as client,
        ):
            for _ in range(args.rounds):
                for label, (model, x_name, y_name) in paths.items():
                    inputs = [_input(x_name, x)]
                    outputs = [grpcclient.InferRequestedOutput(y_name)]
                    for i in range(20 + args.requests):
                        start = time.perf_counter()
                        answer = client.infer(model, inputs, outputs=outputs).as_numpy(y_name)
                        if i >= 20:
                            times[label].append(time.perf_counter() - start)
                        np.testing.assert_allclose(answer, y, rtol=1e-6)
    medians = {}
    for label, seconds in times.items():
        ms = np.array(seconds) * 1e3
        medians[label] = float(np.median(ms))
        print(
            f"{label:38s} mean {ms.mean():6.2f} ms  p50 {medians[label]:6.2f} ms  "
            f"p99 {np.percentile(ms, 99):6.2f} ms  ({len(ms)} requests)"
        )
    a, b = medians.values()
    print(f"ratio a/b (p50): {a / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
