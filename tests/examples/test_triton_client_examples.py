"""Triton's own client examples, unchanged, against ``hloserve serve --workers 2`` of ``simple``
(examples/triton_simple) and ``simple_sequence`` (examples/sequence): every example
docs/conformance.md marks ``served`` on both, run on worker 0 directly (one tritonserver of
hloserve) and through the gateway; each must exit 0.

Triton's model-control examples run against ``serve --open-repository-api`` (one worker and
two, the gateway in front) of a repository of the 8 models they expect. Triton's image
classification examples run against the same ``--workers 2`` with the digits bundle given an
image ``format`` and ``labels`` (docs/bundles.md).

The examples are not part of this repository (nor fetched here: the tests run offline):
``HLOSERVE_TRITON_EXAMPLES`` names a checkout's ``src/python/examples``
(triton-inference-server/client); without it the test is skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hloserve.ports import free_ports
from tests.conftest import ROOT, _import_script, import_example
from tests.model_repository_tools.test_classification_serve import LABELS, label_digits
from tests.node.test_serve_cli import launch_serve, serve_two_workers, stop_serve, wait_for_line
from tests.test_conformance_table import TABLE, rows

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.triton_examples,
    pytest.mark.timeout(900),
]
pytest.importorskip("tritonclient.grpc")

EXAMPLES = os.environ.get("HLOSERVE_TRITON_EXAMPLES")
THIS = "tests/examples/test_triton_client_examples.py::test_example"


def listed() -> list[str]:
    """The examples docs/conformance.md marks served on one server and the gateway by this
    test."""
    names = []
    for cells in rows(TABLE.read_text()):
        if cells[1:3] == ["served", "served"] and THIS in cells[3]:
            names += re.findall(r"`([\w.]+\.py)`", cells[0])
    return names


def runs(example: str) -> list[tuple[str, ...]]:
    """(protocol, extra arguments) of each run of ``example``."""
    if example == "reuse_infer_objects_client.py":
        return [("grpc", "-i", "grpc"), ("http", "-i", "http")]
    return [("http",)] if "http" in example else [("grpc",)]


@pytest.fixture(scope="module")
def endpoints(
    tmp_path_factory: pytest.TempPathFactory, digits_bundle: Path
) -> Iterator[dict[str, dict[str, str]]]:
    """``{"direct" | "gateway": {"grpc": host:port, "http": host:port}}``."""
    if not EXAMPLES:
        pytest.skip("HLOSERVE_TRITON_EXAMPLES is not set (Triton's src/python/examples)")
    root = tmp_path_factory.mktemp("examples")
    label_digits(Path(shutil.copytree(digits_bundle, root / "bundles" / "digits")))
    script = ROOT / "examples" / "triton_simple" / "export.py"
    _import_script(script, "triton_simple_export").export_simple(root / "bundles")
    import_example("sequence", "export").export_sequence(root / "bundles")
    log = root / "serve.log"
    proc, grpc, http, _ = serve_two_workers(root / "bundles", log, "--admin-port", "0")
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 600)
        worker = re.search(r"worker 0 .*HTTP http://([\d.:]+)  gRPC ([\d.:]+)", log.read_text())
        assert worker is not None
        yield {
            "direct": {"http": worker.group(1), "grpc": worker.group(2)},
            "gateway": {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}"},
        }
    finally:
        stop_serve(proc)


@pytest.mark.parametrize("via", ["direct", "gateway"])
@pytest.mark.parametrize("example", listed())
def test_example(endpoints: dict[str, dict[str, str]], example: str, via: str) -> None:
    script = Path(str(EXAMPLES)) / example
    assert script.is_file(), f"{script} is missing from HLOSERVE_TRITON_EXAMPLES"
    for protocol, *extra in runs(example):
        done = subprocess.run(
            [sys.executable, str(script), "-u", endpoints[via][protocol], *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{example} {extra} via {via}:\n{done.stdout}{done.stderr}"


#: Triton's model-control examples and the repository size each expects: the gRPC one counts 8
#: models in the index, the HTTP one 7 (docs/serving.md, "Model control mode").
MODEL_CONTROL = {"simple_grpc_model_control.py": 8, "simple_http_model_control.py": 7}


@contextlib.contextmanager
def opened(root: Path, workers: int, models: int) -> Iterator[dict[str, str]]:
    """``serve --open-repository-api --workers N`` of ``simple`` and copies, ``models`` models
    with the runtime: ``{"grpc": host:port, "http": host:port, "log": path}``."""
    script = ROOT / "examples" / "triton_simple" / "export.py"
    export = _import_script(script, "triton_simple_export").export_simple
    for name in ("simple", *(f"simple_copy_{i}" for i in range(1, models - 1))):
        export(root / "bundles", name)
    http, grpc, metrics = free_ports(3)
    log = root / "serve.log"
    proc = launch_serve(
        root / "bundles", log, "--open-repository-api", "--workers", str(workers),
        "--gpus", "none", "--worker-port-base", "0", "--admin-port", "0",
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
    )  # fmt: skip
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 600)
        yield {"grpc": f"127.0.0.1:{grpc}", "http": f"127.0.0.1:{http}", "log": str(log)}
    finally:
        stop_serve(proc)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "two-workers"])
@pytest.mark.parametrize("example", sorted(MODEL_CONTROL))
def test_model_control_example(tmp_path: Path, example: str, workers: int) -> None:
    """Each model-control example exits 0 against ``serve --open-repository-api``, its
    over-long ``file:`` step included; the same tritonserver(s) keep running (no restart)."""
    if not EXAMPLES:
        pytest.skip("HLOSERVE_TRITON_EXAMPLES is not set (Triton's src/python/examples)")
    script = Path(str(EXAMPLES)) / example
    assert script.is_file(), f"{script} is missing from HLOSERVE_TRITON_EXAMPLES"
    with opened(tmp_path, workers, MODEL_CONTROL[example]) as served:
        log = Path(served["log"])
        started = re.findall(r"tritonserver \(pid \d+\)", log.read_text())
        url = served["http" if "http" in example else "grpc"]
        done = subprocess.run(
            [sys.executable, str(script), "-u", url], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{example}:\n{done.stdout}{done.stderr}"
        assert "PASS: model control" in done.stdout
        assert re.findall(r"tritonserver \(pid \d+\)", log.read_text()) == started


#: (example, protocol, extra arguments) of each image-classification run
IMAGE_CLIENTS = [
    ("image_client.py", "http", ()),
    ("image_client.py", "grpc", ("-i", "grpc")),
    ("grpc_image_client.py", "grpc", ()),
]


@pytest.mark.parametrize("via", ["direct", "gateway"])
@pytest.mark.parametrize(
    ("example", "protocol", "extra"), IMAGE_CLIENTS, ids=[f"{e}-{p}" for e, p, _ in IMAGE_CLIENTS]
)
def test_image_client_example(
    endpoints: dict[str, dict[str, str]],
    tmp_path: Path,
    example: str,
    protocol: str,
    extra: tuple[str, ...],
    via: str,
) -> None:
    """Each image-classification example, unchanged, reads the digits model's ``format``
    (NHWC) and shape from its metadata and config, sends an 8x8 grey image with ``-c 3``
    (Triton's classification extension) and prints three classes, each with its label from
    the bundle's label file, then PASS."""
    from PIL import Image

    if protocol == "http":  # the example's own dependency, not the server's
        pytest.importorskip("attrdict", reason="image_client.py over HTTP imports attrdict "
                            "(pip install attrdict3 on Python 3.10 and later)")  # fmt: skip
    script = Path(str(EXAMPLES)) / example
    assert script.is_file(), f"{script} is missing from HLOSERVE_TRITON_EXAMPLES"
    image = tmp_path / "digit.png"
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), "L").save(image)
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "-m",
            "digits",
            "-c",
            "3",
            "-s",
            "NONE",
            "-u",
            endpoints[via][protocol],
            *extra,
            str(image),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{example} {extra} via {via}:\n{done.stdout}{done.stderr}"
    classes = re.findall(r"^\s+[-\d.e+]+ \((\d)\) = (\w+)$", done.stdout, re.MULTILINE)
    assert len(classes) == 3, done.stdout
    assert all(label == LABELS[int(index)] for index, label in classes), classes
    assert "PASS" in done.stdout
