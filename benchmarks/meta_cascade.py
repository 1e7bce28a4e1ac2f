"""What a meta model costs against the same cascade run by the client, side by side.

    .venv/bin/python benchmarks/meta_cascade.py [--rounds 3] [--batch 8]

Exports examples/digits_cascade's bundles, serves them in one tritonserver, and classifies the
held-out split in requests of ``--batch`` images, one client, three ways, alternating per round:

(a) the meta ``digits_cascade`` (one request; the fast model, then the CNN for unsure images,
    over BLS inside the server);
(b) the client runs the same cascade: a request to ``digits_fast``, then one to ``digits`` with
    the unsure images (two round trips when any image is unsure);
(c) the CNN ``digits`` alone (one request).

Prints milliseconds per request (median over rounds) and the ratios a/b and a/c. The machine is
noisy: read ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CASCADE = ROOT / "examples" / "digits_cascade"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"cascade_{name}", CASCADE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="images per request (<= 32)")
    args = parser.parse_args()

    import tritonclient.grpc as grpcclient

    from hloserve.model_repository_tools.build import build_repository
    from hloserve.node.serve_options import ServeOptions, server_options
    from hloserve.node.tritonserver import TritonServer
    from hloserve.ports import free_ports

    export = _load("export")
    client_mod = _load("client")
    rule = client_mod.cascade_rule()
    _, _, images, _ = client_mod.digits_model.load_split()
    with tempfile.TemporaryDirectory(prefix="meta-bench-") as tmp:
        bundles = Path(tmp) / "bundles"
        bundles.mkdir()
        export.export_digits(bundles)
        export.export_fast(bundles)
        export.write_meta(bundles)
        repo = Path(tmp) / "repository"
        build_repository(bundles, repo)
        http, grpc_port, metrics = free_ports(3)
        options = ServeOptions(repo, http_port=http, grpc_port=grpc_port, metrics_port=metrics)
        triton = dataclasses.replace(server_options(options, repo), startup_timeout_s=300.0)
        with TritonServer(triton) as server:
            client = grpcclient.InferenceServerClient(server.urls.grpc)
            infer = client_mod.infer
            chunks = [images[i : i + args.batch] for i in range(0, len(images), args.batch)]

            def meta(chunk: np.ndarray) -> None:
                infer(client, grpcclient, "digits_cascade", chunk, ["label", "stage"])

            def by_client(chunk: np.ndarray) -> None:
                (logits,) = infer(client, grpcclient, "digits_fast", chunk, ["logits"])
                _, confidence = rule.top1(logits)
                unsure = confidence < rule.THRESHOLD
                if unsure.any():
                    infer(client, grpcclient, "digits", chunk[unsure], ["logits"])

            def strong(chunk: np.ndarray) -> None:
                infer(client, grpcclient, "digits", chunk, ["logits"])

            ways = {"(a) meta": meta, "(b) client cascade": by_client, "(c) CNN alone": strong}
            for fn in ways.values():  # warm every path once
                fn(chunks[0])
            ms: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(args.rounds):
                for name, fn in ways.items():
                    start = time.perf_counter()
                    for chunk in chunks:
                        fn(chunk)
                    ms[name].append((time.perf_counter() - start) * 1e3 / len(chunks))
    med = {k: statistics.median(v) for k, v in ms.items()}
    for name, value in med.items():
        print(f"{name:20} {value:7.2f} ms/request  ({len(chunks)} requests of {args.batch})")
    a, b, c = med.values()
    print(f"ratio a/b (meta vs client cascade): {a / b:.2f}")
    print(f"ratio a/c (meta vs CNN alone):      {a / c:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
