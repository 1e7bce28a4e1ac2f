"""``hloserve serve BUNDLES --watch`` on a real tritonserver, under a bounded load loop on ``a``.

One server for the whole story (2 shared cores): ``a`` (the golden affine bundle) and the meta
``m`` calling it are served; ``a``'s weights are replaced on disk (a rename) -> ``a`` and ``m``
answer with the new weights, not one request of the loop fails and nothing is compiled (the
executable cache has ``a``'s executables); ``b`` is added (a plain, non-atomic copy) -> served,
from the cache; ``b`` removed -> NOT_FOUND; ``a``'s manifest broken -> the old ``a`` keeps
answering and ``hloserve status --models`` reports the error; ``m`` changed so that it fails
to load in Triton -> the repository is rolled back and ``m``'s version 1 keeps answering.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.ports import free_ports
from hloserve.prometheus_text import parse_samples
from tests.conftest import GOLDEN, ROOT
from tests.node.test_serve_cli import stop_serve
from tests.node.test_watch import META_RUN, write_meta

pytestmark = [pytest.mark.tritonserver, pytest.mark.timeout(600)]
grpcclient = pytest.importorskip("tritonclient.grpc")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

X = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
INTERVAL_S = 0.5


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    log: Path
    grpc: str
    metrics: str
    admin: str = ""

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = re.search(pattern, self.text())
            if match:
                return match
            assert self.process.poll() is None, f"serve exited:\n{self.text()[-4000:]}"
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not seen in {timeout_s} s:\n{self.text()[-4000:]}")


@dataclass
class LoadLoop:
    """Requests to ``a`` one after another, in a thread, bounded in count and time."""

    grpc: str
    answers: list[np.ndarray] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = grpcclient.InferenceServerClient(self.grpc)
        deadline = time.monotonic() + 400
        try:
            for _ in range(30_000):
                if self.stop.is_set() or time.monotonic() > deadline:
                    return
                try:
                    self.answers.append(infer(client, "a"))
                except Exception as exc:
                    self.failures.append(str(exc))
                time.sleep(0.005)
        finally:
            client.close()


def affine(params: dict[str, np.ndarray]) -> np.ndarray:
    """The golden affine model's y (tests/golden/make_golden.py) at X."""
    return np.tanh(X @ params["w"] + params["b"])


def infer(client: Any, model: str) -> np.ndarray:
    tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    return np.asarray(client.infer(model, [tensor]).as_numpy("y"))


def compiled(serve: Serve) -> float:
    """Executables compiled by the runtime so far (hloserve_executables_total)."""
    with urllib.request.urlopen(f"http://{serve.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        v
        for name, labels, v in parse_samples(text)
        if name == "hloserve_executables_total" and labels.get("source") == "compiled"
    )


def status_models(serve: Serve) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "hloserve.cli", "status", "--models", serve.admin],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def until(
    check: Callable[[], bool], timeout_s: float, what: str | Callable[[], str], serve: Serve
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"{said} not within {timeout_s} s:\n{serve.text()[-4000:]}")
        assert serve.process.poll() is None, f"serve exited:\n{serve.text()[-4000:]}"
        time.sleep(0.2)


def watch_serve(bundles: Path, log: Path, *extra: str) -> Serve:
    """``hloserve serve BUNDLES --watch`` polling every :data:`INTERVAL_S`, on free ports,
    its output in ``log`` (``metrics`` is the first server's, or the gateway's admin port)."""
    http, grpc, metrics = free_ports(3)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "hloserve.cli", "serve", str(bundles), "--watch",
             "--watch-interval", str(INTERVAL_S), "--admin-port", "0", "--http-port", str(http),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics), *extra],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    return Serve(process, log, f"127.0.0.1:{grpc}", f"127.0.0.1:{metrics}")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "a")
    write_meta(bundles, "m")
    serve = watch_serve(bundles, tmp_path / "serve.log", "--front-instances", "1")
    process = serve.process
    try:
        serve.wait_for(r"hloserve: ready after", 240)
        serve.admin = serve.wait_for(r"admin +http://([0-9.:]+)/metrics", 10).group(1)
        serve.wait_for(r"watching .* every 0.5 s", 10)
        yield serve
    finally:
        stop_serve(process)


def test_watch_reloads_adds_and_removes_bundles_without_failing_a_request(
    serve: Serve, tmp_path: Path
) -> None:
    bundles = tmp_path / "bundles"
    client = grpcclient.InferenceServerClient(serve.grpc)
    old_y = infer(client, "a")
    assert np.array_equal(infer(client, "m"), old_y)
    loop = LoadLoop(serve.grpc)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        until(lambda: len(loop.answers) > 20, 60, "the loop's first answers", serve)
        compiled_at_start = compiled(serve)

        # a's weights replaced (written beside, renamed over): y = tanh(x @ 2w + 2b)
        weights = bundles / "a" / "weights.safetensors"
        params = safetensors_numpy.load_file(weights)
        assert np.allclose(old_y, affine(params), atol=1e-5)
        doubled = {k: v * 2 for k, v in params.items()}
        new_y = affine(doubled)
        assert not np.allclose(new_y, old_y, atol=1e-3)
        safetensors_numpy.save_file(doubled, bundles / "a" / ".weights.new")
        changed_at = time.monotonic()
        os.replace(bundles / "a" / ".weights.new", weights)
        until(
            lambda: np.allclose(loop.answers[-1], new_y, atol=1e-5),
            120,
            lambda: f"a's new answers (last {loop.answers[-1]}, want {new_y})",
            serve,
        )
        took = time.monotonic() - changed_at
        serve.wait_for(r"meta model 'm': reloading after its callees", 60)
        until(
            lambda: np.allclose(infer(client, "m"), new_y, atol=1e-5), 60, "m's new answers", serve
        )
        assert "model 'a': version 2 READY" in serve.text()
        assert compiled(serve) == compiled_at_start, "a's new version compiled again"

        # b added: a plain copy, file by file (the debounce waits for it to hold still)
        shutil.copytree(GOLDEN / "affine", bundles / "b")
        until(lambda: "model 'b': version 1 READY" in serve.text(), 120, "b served", serve)
        assert np.allclose(infer(client, "b"), old_y, atol=1e-5)
        assert compiled(serve) == compiled_at_start, "b (a's executables) or a was compiled"

        # b removed: unloaded, NOT_FOUND after
        shutil.rmtree(bundles / "b")
        until(lambda: "model 'b': unloaded" in serve.text(), 120, "b unloaded", serve)
        with pytest.raises(grpcclient.InferenceServerException) as refused:
            infer(client, "b")
        assert refused.value.status() == "StatusCode.NOT_FOUND", refused.value

        # a broken: the old a keeps answering, the error is reported
        answered = len(loop.answers)
        bad = bundles / "a" / ".manifest.new"
        bad.write_text("format_version: 1\nkind: model\ninputs: not a list\n")
        os.replace(bad, bundles / "a" / "manifest.yaml")
        until(lambda: "model 'a': validation failed" in serve.text(), 60, "a refused", serve)
        table = status_models(serve)
        row = next(line for line in table.splitlines() if line.startswith("a "))
        assert re.match(r"a +2 +READY +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +bundle 'a'", row), table
        assert "invalid" in row, table
        assert re.search(r"^m +1 +READY", table, re.M), table
        until(lambda: len(loop.answers) > answered + 20, 60, "a answering after", serve)
        assert np.allclose(loop.answers[-1], new_y, atol=1e-5)

        # m valid but failing to load (its model.py raises on import): m's version 1 serves on
        broken = bundles / "m" / ".model.new"
        broken.write_text("raise RuntimeError('broken on purpose')\n" + META_RUN)
        os.replace(broken, bundles / "m" / "model.py")
        failed = "model 'm': load of version 2 failed"
        until(lambda: failed in serve.text(), 120, "m refused", serve)
        assert np.allclose(infer(client, "m"), new_y, atol=1e-5)
        assert "version 1 keeps serving" in serve.text() and "broken on purpose" in serve.text()
        row = next(line for line in status_models(serve).splitlines() if line.startswith("m "))
        assert re.match(r"m +1 +READY .*broken on purpose", row), row
    finally:
        loop.stop.set()
        thread.join(30)
        client.close()
    assert loop.failures == [], loop.failures[:5]
    print(
        f"{len(loop.answers)} requests to a, none failed; "
        f"new weights served {took:.1f} s after the rename"
    )


def test_watch_with_two_workers_changes_every_worker(tmp_path: Path) -> None:
    """``serve --watch --workers 2``: a's weights replaced -> both workers (and the gateway)
    answer the new weights with no failed request of a loop through the gateway; b added ->
    both workers serve it; b removed -> NOT_FOUND through the gateway."""
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "a")
    log = tmp_path / "serve.log"
    serve = watch_serve(bundles, log, "--workers", "2", "--worker-port-base", "0")
    process = serve.process
    loop = LoadLoop(serve.grpc)
    thread = threading.Thread(target=loop.run, daemon=True)
    try:
        serve.wait_for(r"hloserve: ready after", 300)
        serve.wait_for(r"watching .* every 0.5 s", 10)
        workers = re.findall(r"worker \d+ tritonserver \(pid \d+\).*gRPC (\S+)", serve.text())
        assert len(workers) == 2, serve.text()[-3000:]
        clients = [grpcclient.InferenceServerClient(w) for w in workers]
        old_y = infer(clients[0], "a")
        thread.start()
        until(lambda: len(loop.answers) > 20, 60, "the loop's first answers", serve)

        weights = bundles / "a" / "weights.safetensors"
        doubled = {k: v * 2 for k, v in safetensors_numpy.load_file(weights).items()}
        new_y = affine(doubled)
        safetensors_numpy.save_file(doubled, bundles / "a" / ".weights.new")
        os.replace(bundles / "a" / ".weights.new", weights)
        until(
            lambda: all(np.allclose(infer(c, "a"), new_y, atol=1e-5) for c in clients),
            180,
            "a's new answers on both workers",
            serve,
        )
        until(lambda: np.allclose(loop.answers[-1], new_y, atol=1e-5), 30, "gateway", serve)
        assert not np.allclose(new_y, old_y, atol=1e-3)

        shutil.copytree(GOLDEN / "affine", bundles / "b")
        until(lambda: "model 'b': version 1 READY" in serve.text(), 180, "b served", serve)
        assert all(np.allclose(infer(c, "b"), old_y, atol=1e-5) for c in clients)

        shutil.rmtree(bundles / "b")
        until(lambda: "model 'b': unloaded" in serve.text(), 120, "b unloaded", serve)
        gateway = grpcclient.InferenceServerClient(serve.grpc)

        def refused() -> bool:
            try:
                infer(gateway, "b")
            except grpcclient.InferenceServerException as exc:
                return exc.status() == "StatusCode.NOT_FOUND"
            return False

        until(refused, 30, "NOT_FOUND for b through the gateway", serve)
        loop.stop.set()
        thread.join(30)
        assert loop.failures == [], loop.failures[:3]
    finally:
        loop.stop.set()
        stop_serve(process)
