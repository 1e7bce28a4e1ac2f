"""ModelStreamInfer through ``hloserve serve --workers 2``: HAProxy routes a stream by its first
message's ``model_name`` (docs/gateway.md, "Data plane").

tritonclient's gRPC ``start_stream`` / ``async_stream_infer`` against the gateway's port: the
answers equal the workers' own, HAProxy's backend of the model counts the streams (they do not
take the Python path), and a stream to a model no worker serves ends with an error (CANCELLED
under HAProxy 2.6, which drops the NOT_FOUND of a stream the client has not half-closed).
"""

from __future__ import annotations

import queue
import re
import shutil
import signal
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.node.test_serve_cli import serve_two_workers, stop_serve, wait_for_line

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow, pytest.mark.timeout(600)]
grpcclient = pytest.importorskip("tritonclient.grpc")
pytestmark.append(
    pytest.mark.skipif(
        shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
        reason="HAProxy is not installed (scripts/haproxy.sh)",
    )
)


def _images(i: int) -> Any:
    tensor = grpcclient.InferInput("image", [2, 8, 8, 1], "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(i).random((2, 8, 8, 1), dtype=np.float32))
    return tensor


def _stream(address: str, model: str, count: int) -> list[tuple[Any, Any]]:
    """(result, error) of each answer of one stream of ``count`` requests (30 s bound)."""
    client = grpcclient.InferenceServerClient(address)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(count):
            client.async_stream_infer(model, [_images(i)], request_id=f"s{i}")
        out = [answers.get(timeout=30)]
        while len(out) < count and out[-1][1] is None:
            out.append(answers.get(timeout=30))
        return out
    finally:
        client.stop_stream()
        client.close()


def _sessions(admin: int, proxy: str) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10).read().decode()
    pattern = rf'^haproxy_server_sessions_total{{proxy="{proxy}",server="[^"]+"}} (\d+)'
    return sum(int(n) for n in re.findall(pattern, text, re.MULTILINE))


def test_streams_go_through_haproxy_by_their_first_message(
    digits_bundle: Path, tmp_path: Path
) -> None:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(digits_bundle, bundles / "digits")
    log = tmp_path / "serve.log"
    proc, grpc_port, _, admin_port = serve_two_workers(
        bundles, log, "--admin-port", "0", "--front-instances", "1",
        env={"HLOSERVE_PROMETHEUS_TARGETS_DIR": str(tmp_path / "targets")},
    )  # fmt: skip
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
        worker = re.findall(r"gRPC (127\.0\.0\.1:\d+)  metrics", log.read_text())[0]
        direct = grpcclient.InferenceServerClient(worker)
        expected = [direct.infer("digits", [_images(i)]).as_numpy("logits") for i in range(4)]
        gateway = f"127.0.0.1:{grpc_port}"

        before = _sessions(admin_port, "m_digits")
        for _ in range(2):  # two streams: round robin puts them on both workers
            answers = _stream(gateway, "digits", 4)
            assert [error for _, error in answers] == [None] * 4
            assert [r.get_response().id for r, _ in answers] == ["s0", "s1", "s2", "s3"]
            for (result, _), logits in zip(answers, expected, strict=True):
                # a message the worker's dynamic batcher runs together with the next one is
                # computed by another batch size's executable: equal up to float rounding
                np.testing.assert_allclose(result.as_numpy("logits"), logits, rtol=1e-4)
        assert _sessions(admin_port, "m_digits") == before + 2  # HAProxy carried both

        # The gateway ends a stream to an unknown model with NOT_FOUND (the aio client, which
        # half-closes first, sees it: tests/gateway/test_haproxy.py); start_stream keeps its
        # side open, and HAProxy 2.6 turns a status sent while the client still streams into
        # RST_STREAM code 8 (haproxy/haproxy#1219): CANCELLED. A fixed HAProxy fails this.
        ((result, error),) = _stream(gateway, "nope", 1)
        assert result is None and error is not None
        assert error.status() == "StatusCode.CANCELLED", error
        assert "RST_STREAM with error code 8" in str(error)
        answers = _stream(gateway, "digits", 1)  # the gateway serves on
        np.testing.assert_allclose(answers[0][0].as_numpy("logits"), expected[0], rtol=1e-4)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        stop_serve(proc)
