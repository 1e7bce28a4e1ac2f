"""Helpers shared by the ``hloserve node`` end-to-end tests (test_node_docker, test_node_process).

``hloserve node up`` runs as a subprocess, as users run it, with its output in a log file;
:class:`NodeProcess` starts it, waits for its "ready" line and stops it.
"""

from __future__ import annotations

import contextlib
import http.client
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hloserve.ports import free_ports

HLOSERVE = str(Path(sys.executable).parent / "hloserve")


def contiguous_free_ports(count: int) -> int:
    """First of ``count`` consecutive ports free on 127.0.0.1, below the ephemeral range."""
    return free_ports(count, contiguous=True)[0]


def two_worker_ports(base: int) -> dict[str, int]:
    """``ports`` section putting worker 0 on base..base+2 and worker 1 on base+3..base+5."""
    return {"http_base": base, "grpc_base": base + 1, "metrics_base": base + 2, "stride": 3}


class NodeProcess:
    """A running ``hloserve node up --config FILE``; its output goes to ``log``."""

    def __init__(
        self,
        settings: dict[str, Any],
        work: Path,
        startup_s: float,
        env: dict[str, str] | None = None,
    ) -> None:
        self.config = work / "node.yaml"
        self.config.write_text(yaml.safe_dump(settings))
        self.log = work / "node.log"
        base = settings["ports"]["http_base"]
        self.gateway = settings["gateway"]["listen"]
        self.worker_http = (f"127.0.0.1:{base}", f"127.0.0.1:{base + 3}")
        self.worker_grpc = (f"127.0.0.1:{base + 1}", f"127.0.0.1:{base + 4}")
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [HLOSERVE, "node", "up", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            # the node's own line: a container's `hloserve serve` prints "[worker i] hloserve:
            # ready after ..., 1 worker(s) ready" before the node has started its gateway
            self.wait_for(f"hloserve node {settings['name']}: ready after", startup_s)
        except BaseException:
            self.stop()
            raise

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float) -> None:
        """Wait until ``text`` is in the log; fail with the log tail if the node exits first."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log_text():
            assert self.process.poll() is None, f"node up exited:\n{self.log_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no {text!r}:\n{self.log_text()[-4000:]}"
            time.sleep(0.3)

    def down(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [HLOSERVE, "node", "down", "--config", str(self.config)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def stop(self) -> None:
        """Ctrl-C the node (SIGKILL after 60 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=60)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def infer_digits(client: Any, images: np.ndarray) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(images))
    return client.infer("digits", [tensor], client_timeout=30).as_numpy("logits")


def successes(grpc_url: str) -> int:
    """Triton's success count of ``digits`` on one worker (0 when it does not answer)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(grpc_url)
        stats = client.get_inference_statistics("digits", as_json=True)
    except InferenceServerException:
        return 0
    return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))


def ready(http_url: str, model: str | None = None) -> bool:
    """Whether the server (or, given, ``model``) at ``http_url`` answers ready."""
    path = "/v2/health/ready" if model is None else f"/v2/models/{model}/ready"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{http_url}{path}", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, http.client.HTTPException):
        return False


class LoadLoop:
    """Digits requests through the gateway from a thread: at most ``limit`` or until stopped.

    ``results`` holds one bool per request: answered and equal to the reference.
    """

    def __init__(self, gateway: str, images: np.ndarray, reference: np.ndarray, limit: int = 3000):
        import threading

        self.results: list[bool] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(gateway, images, reference, limit), daemon=True
        )
        self._thread.start()

    def _run(self, gateway: str, images: np.ndarray, reference: np.ndarray, limit: int) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(gateway)
        for i in range(limit):
            if self._stop.is_set():
                return
            k = i % 32
            try:
                logits = infer_digits(client, images[k : k + 1])
                self.results.append(bool(np.allclose(logits, reference[k : k + 1], atol=1e-5)))
            except InferenceServerException:
                self.results.append(False)
            time.sleep(0.01)

    def wait_count(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.results) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_for_traffic_to(self, worker_grpc: str) -> None:
        """Wait (bounded, 60 s) until a restarted worker serves again and 20 more answers came;
        fail when it got no traffic."""
        served = len(self.results)
        for _ in range(300):  # the restarted worker is rediscovered and gets traffic again
            if successes(worker_grpc) > 0 and len(self.results) > served + 20:
                break
            time.sleep(0.2)
        assert successes(worker_grpc) > 0, "the restarted worker got no traffic"

    def stop(self) -> list[bool]:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.results
