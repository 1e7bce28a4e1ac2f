"""The channel on a real tritonserver: faults, cleanup, large requests, the request limit.

One server (explicit model control, as ``hloserve serve`` runs it, with the stub watchdog):
    affine        the golden bundle, one front instance
    small_limit   a copy of affine built with max_request_bytes=16 (16 bytes of inputs)
    huge          x + 1 on 256 MiB of f32 (64 Mi items), batch 1
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.model_control import RepositoryClient, grpc_metadata
from hloserve.model_repository_tools.build import build_repository
from hloserve.node.tritonserver import TritonServer
from hloserve.node.watchdog import StubWatchdog
from hloserve.triton_backend import channel
from tests.conftest import GOLDEN, export_wide, serving_options

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

HUGE_K = 64 * 1024 * 1024  # f32 items: 256 MiB


def _namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _segments(server_pid: int) -> list[str]:
    return sorted(p.name for p in channel.SHM_DIR.glob(f"hloserve.channel-{server_pid}-*"))


def _repo(root: Path, *, huge: bool) -> Path:
    bundles = root / "bundles"
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    if huge:
        export_wide(bundles / "huge", HUGE_K, lambda x: x + 1)
    repo = root / "repository"
    build_repository(bundles, repo, front_instances=1)
    # small_limit: built as `hloserve repo build --max-request-bytes 16` builds it
    limited = root / "limited"
    shutil.copytree(GOLDEN / "affine", limited / "bundles" / "small_limit")
    build_repository(
        limited / "bundles", limited / "repository", front_instances=1, max_request_bytes=16
    )
    shutil.move(limited / "repository" / "small_limit", repo / "small_limit")
    return repo


class Watched:
    """A started server with the stub watchdog checking every 0.25 s (as ``hloserve serve``)."""

    def __init__(self, server: TritonServer) -> None:
        self.server = server
        self.lines: list[str] = []
        key = server.options.model_control_key
        self.watchdog = StubWatchdog(
            server,
            RepositoryClient(server.urls.http, key, 600.0).reload,
            self.lines.append,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            self.watchdog.check()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def wait_reloaded(self, model: str, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while f"hloserve: model '{model}': reloaded" not in self.lines:
            assert time.monotonic() < end, self.lines
            time.sleep(0.1)
        self.lines.clear()


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    repo = _repo(tmp_path_factory.mktemp("channel_triton"), huge=True)
    with TritonServer(serving_options(repo)) as server:
        w = Watched(server)
        yield w
        w.close()


def _x(rows: int = 1) -> Any:
    tensor = grpcclient.InferInput("x", [rows, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 4), np.float32))
    return tensor


def _stub_pids(server: TritonServer, model: str) -> list[int]:
    return [s.pid for s in server.stub_processes() if s.model == model and not s.dead]


def _load_loop(url: str, model: str, stop: threading.Event, seconds: float) -> dict[str, Any]:
    """Sequential requests until ``stop`` (bounded): outcomes with their times."""
    client = grpcclient.InferenceServerClient(url)
    outcome: dict[str, Any] = {"ok": 0, "errors": []}
    end = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < end:
        start = time.monotonic()
        try:
            client.infer(model, [_x()], client_timeout=30)
            outcome["ok"] += 1
        except InferenceServerException as exc:
            outcome["errors"].append((exc.status(), str(exc), time.monotonic() - start))
            time.sleep(0.05)
    client.close()
    return outcome


@pytest.mark.parametrize("victim", [names.RUNTIME_MODEL, "affine"])
def test_a_killed_stub_fails_in_flight_requests_fast_and_recovers(
    watched: Watched, victim: str
) -> None:
    server = watched.server
    (pid,) = _stub_pids(server, victim)
    stop = threading.Event()
    results: list[dict[str, Any]] = []
    loops = [
        threading.Thread(
            target=lambda: results.append(_load_loop(server.urls.grpc, "affine", stop, 120))
        )
        for _ in range(4)
    ]
    if victim == names.RUNTIME_MODEL:  # killed under load: what was in flight fails fast
        for t in loops:
            t.start()
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
    else:
        # A front stub killed while Triton's Python backend exchanges a message with it can
        # abort tritonserver itself (boost::interprocess::lock_exception in libtriton_python,
        # tritonserver 2.51; docs/serving.md, "Faults"): kill it between requests, then load it
        # at once, so requests meet the dead stub and then its reload.
        os.kill(pid, signal.SIGKILL)
        for t in loops:
            t.start()
    watched.wait_reloaded(victim)
    time.sleep(1.0)
    before = sum(r["ok"] for r in results)
    stop.set()
    for t in loops:
        t.join(60)
    errors = [e for r in results for e in r["errors"]]
    print(f"killed {victim} (pid {pid}): {sum(r['ok'] for r in results)} ok, errors {errors}")
    if victim == names.RUNTIME_MODEL:  # the fronts fail what was in flight: UNAVAILABLE, fast
        assert all(s == "StatusCode.UNAVAILABLE" and t < 1.0 for s, _, t in errors), errors
    else:  # a dead front stub cannot answer: Triton does, until the watchdog's reload
        odd = [e for e in errors if "not healthy" not in e[1] and e[0] != "StatusCode.UNAVAILABLE"]
        assert odd == [], odd
    client = grpcclient.InferenceServerClient(server.urls.grpc)
    for _ in range(10):
        assert client.infer("affine", [_x()]).as_numpy("y").shape == (1, 3)
    client.close()
    assert pid not in _stub_pids(server, victim)
    del before


def test_requests_over_the_limit_are_refused_naming_it(watched: Watched) -> None:
    import tritonclient.http as httpclient

    client = grpcclient.InferenceServerClient(watched.server.urls.grpc)
    assert client.infer("small_limit", [_x(1)]).as_numpy("y").shape == (1, 3)  # 16 bytes
    with pytest.raises(InferenceServerException) as info:
        client.infer("small_limit", [_x(2)])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "32 bytes, more than the limit of 16 bytes (--max-request-bytes)" in str(info.value)
    assert client.infer("small_limit", [_x(1)]).as_numpy("y").shape == (1, 3)  # still serving
    client.close()
    http = httpclient.InferenceServerClient(watched.server.urls.http)
    tensor = httpclient.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 4), np.float32))
    with pytest.raises(InferenceServerException) as info:
        http.infer("small_limit", [tensor])
    assert info.value.status() == "400"
    assert "limit of 16 bytes" in str(info.value)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert http.infer("small_limit", [tensor]).as_numpy("y").shape == (1, 3)
    http.close()


def test_a_256_mib_request_round_trips(watched: Watched) -> None:
    client = grpcclient.InferenceServerClient(watched.server.urls.grpc)
    x = np.arange(HUGE_K, dtype=np.float32).reshape(1, HUGE_K) % 1000
    tensor = grpcclient.InferInput("x", [1, HUGE_K], "FP32")
    tensor.set_data_from_numpy(x)
    y = client.infer("huge", [tensor], client_timeout=240).as_numpy("y")
    np.testing.assert_array_equal(y, x + 1)
    client.close()


def test_no_segment_is_left_after_a_stop_and_a_killed_servers_are_cleaned(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path, huge=False)
    with TritonServer(serving_options(repo)) as server:
        pid = server.pid
        found = sorted(p.name for p in channel.SHM_DIR.glob("hloserve.channel-*"))
        assert len(_segments(pid)) == 2, (pid, found)  # one arena per front instance
    assert _segments(pid) == []  # a normal stop removes them
    killed = TritonServer(serving_options(repo))
    killed.start()
    try:
        pid = killed.pid
        end = time.monotonic() + 120
        while len(_segments(pid)) < 2:  # the fronts are up
            assert time.monotonic() < end
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        time.sleep(3.0)  # the stubs see their parent gone and exit
        left = _segments(pid)
    finally:
        killed.stop()
    with TritonServer(serving_options(repo)) as server:
        assert all(name not in _segments(server.pid) for name in left)
        leftovers = [n for n in left if (channel.SHM_DIR / n).exists()]
        assert leftovers == [], leftovers  # matched to their dead owner, removed at start
    assert re.match(r"\d+", str(_namespace()))


def _weight_series(server: TritonServer, model: str) -> dict[str, float]:
    """``model``'s resident bytes and weight bytes on the server's metrics port."""
    with urllib.request.urlopen(f"http://{server.urls.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for key, metric in (
        ("resident", "hloserve_weight_resident_bytes"),
        ("weights", "hloserve_weight_bytes"),
    ):
        for line in text.splitlines():
            if line.startswith(metric + "{") and f'model="{model}"' in line:
                found[key] = float(line.rsplit(" ", 1)[1])
    return found


def test_loading_a_model_under_load_leaves_the_runtime_and_the_others_alone(
    watched: Watched,
) -> None:
    server = watched.server
    repo = server.options.model_repository
    late = Path(repo) / "late"
    shutil.copytree(Path(repo) / "affine", late)
    config = late / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "affine"', 'name: "late"'))
    (runtime_pid,) = _stub_pids(server, names.RUNTIME_MODEL)
    client = grpcclient.InferenceServerClient(server.urls.grpc)

    def count() -> int:
        stats = client.get_inference_statistics(model_name="affine")
        return int(stats.model_stats[0].inference_count)

    stop = threading.Event()
    results: list[dict[str, Any]] = []
    loop = threading.Thread(
        target=lambda: results.append(_load_loop(server.urls.grpc, "affine", stop, 120))
    )
    loop.start()
    time.sleep(0.5)
    before = count()
    control = dict(grpc_metadata(server.options.model_control_key))
    client.load_model("late", headers=control)
    during = count()
    assert client.infer("late", [_x()]).as_numpy("y").shape == (1, 3)
    assert _weight_series(server, "late") == {"resident": 60.0, "weights": 60.0}
    client.unload_model("late", headers=control)
    time.sleep(0.5)
    deadline = time.monotonic() + 10  # the runtime lets go once the last front has gone
    while any(_weight_series(server, "late").values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    # no bytes counted for it any more (the rows add up to the total; placement reads them)
    assert _weight_series(server, "late") == {"resident": 0.0, "weights": 0.0}
    stop.set()
    loop.join(60)
    (outcome,) = results
    assert outcome["errors"] == [] and outcome["ok"] > 0
    assert during > before  # the first model kept serving while the second loaded
    assert _stub_pids(server, names.RUNTIME_MODEL) == [runtime_pid]  # no runtime reload
    client.close()
