"""A meta's sub-calls to bundles over the channel (hloserve.meta.channel_calls), in process.

The callees' fronts live in the test's process (as in a meta instance) and reach an
in-process runtime at the address a tritonserver's runtime has (tests/triton_backend/
front_testing.py); the repository is built by ``build_repository``, as on a worker.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.errors import HloserveError, Status
from hloserve.meta.channel_calls import ChannelCalls, front_args
from hloserve.model_repository_tools.build import build_repository
from hloserve.triton_backend import channel
from hloserve.triton_backend.front.core import FrontModel
from hloserve.triton_backend.runtime.scheduler import Work
from hloserve.triton_backend.runtime.server import RuntimeServer
from tests.conftest import GOLDEN, needs_tritonclient
from tests.echo_bundle import export_echo
from tests.triton_backend.front_testing import (
    RecordingRuntime,
    front,
    runtime_server,
    server_key,
)

# the fixture builds a model repository (Triton model configs)
pytestmark = [needs_tritonclient, pytest.mark.usefixtures("restore_x64")]

EXPECTED = dict(np.load(GOLDEN / "affine.expected.npz"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bundles = tmp_path_factory.mktemp("channel_calls") / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    export_echo(bundles / "echo")
    out = bundles.parent / "repository"
    build_repository(bundles, out)
    (out / "foreign").mkdir()  # a Triton model of another backend
    (out / "foreign" / "config.pbtxt").write_text('name: "foreign"\nbackend: "onnxruntime"\n')
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[RuntimeServer]:
    address = channel.address(names.RUNTIME_MODEL, server_key())  # where a meta looks
    with runtime_server(address=address) as srv:
        yield srv


def test_bundles_go_over_the_channel_foreign_models_do_not(
    repo: Path, server: RuntimeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    foreign: list[tuple[str, int]] = []

    def bls(model: str, inputs: Any, outputs: Any, timeout_us: int) -> dict[str, np.ndarray]:
        foreign.append((model, timeout_us))
        return {"z": np.zeros(1)}

    submitted: list[Work] = []
    submit = server.scheduler.submit
    monkeypatch.setattr(server.scheduler, "submit", lambda w: (submitted.append(w), submit(w)))
    calls = ChannelCalls(repo, ["affine", "echo", "foreign", "ghost"], foreign=bls, key=server.key)
    try:
        assert [calls.serves(m) for m in ("affine", "echo", "foreign", "ghost")] == [
            True,
            True,
            False,
            False,
        ]
        out = calls.send("affine", {"x": EXPECTED["x"]}, ["y"], 0)
        assert list(out) == ["y"]
        np.testing.assert_allclose(out["y"], EXPECTED["y"], rtol=1e-6)
        both = calls.send("affine", {"x": EXPECTED["x"][:1]}, [], 30_000_000)
        assert set(both) == {"y", "label"}
        blob = np.array([b"a\x00b", b""], dtype=object)  # the callee's hooks run here
        assert list(calls.send("echo", {"blob": blob}, [], 0)["blob"]) == list(blob)
        with pytest.raises(HloserveError, match=r"model 'affine': unknown output 'nope'"):
            calls.send("affine", {"x": EXPECTED["x"]}, ["nope"], 0)
        with pytest.raises(HloserveError, match="expected dtype FP32") as info:
            calls.send("affine", {"x": EXPECTED["x"].astype(np.float64)}, [], 0)
        assert info.value.status is Status.INVALID_ARGUMENT  # the callee's own check
        assert list(calls.send("foreign", {"x": EXPECTED["x"]}, [], 7)) == ["z"]
        assert foreign == [("foreign", 7)]
        # sub-calls over the channel, per callee (the meta shim's hloserve_meta_subcalls_total)
        assert calls.take_sent() == {"affine": 4, "echo": 1} and calls.take_sent() == {}
        # every one entered the runtime's scheduler committed: ahead of the callee's queue
        assert len(submitted) == 4 and all(w.committed for w in submitted)
    finally:
        calls.close()
    alone = ChannelCalls(repo, ["ghost"], key=server.key)
    with pytest.raises(HloserveError, match="'ghost' is not a bundle") as info:
        alone.send("ghost", {}, [], 0)
    assert info.value.status is Status.NOT_FOUND
    deadline = time.monotonic() + 10
    while server.core.bundle_names:  # the runtime releases the meta's holds
        assert time.monotonic() < deadline, server.core.bundle_names
        time.sleep(0.01)


def test_a_sub_call_shed_for_its_deadline_is_deadline_exceeded(
    repo: Path, server: RuntimeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two meta instances: the first one's sub-call holds the runtime, the second one's waits
    in the queue past its timeout and is shed (never executed)."""
    first = ChannelCalls(repo, ["affine"], key=server.key)
    second = ChannelCalls(repo, ["affine"], key=server.key)
    for calls in (first, second):  # both connected before the runtime is held
        calls.send("affine", {"x": EXPECTED["x"]}, [], 0)
    real = server.core.run
    entered, go = threading.Event(), threading.Event()

    def held(*args: Any) -> Any:
        entered.set()
        assert go.wait(30)
        return real(*args)

    monkeypatch.setattr(server.core, "run", held)
    try:
        busy = threading.Thread(target=first.send, args=("affine", {"x": EXPECTED["x"]}, [], 0))
        busy.start()
        assert entered.wait(30)
        monkeypatch.setattr(server.core, "run", real)
        errors: list[HloserveError] = []

        def late() -> None:
            try:
                second.send("affine", {"x": EXPECTED["x"]}, [], 50_000)
            except HloserveError as exc:
                errors.append(exc)

        waiting = threading.Thread(target=late)
        waiting.start()
        time.sleep(0.3)  # queued behind the held execution; its 50 ms pass
        go.set()
        busy.join(30)
        waiting.join(30)
        [error] = errors
        assert error.status is Status.DEADLINE_EXCEEDED
        assert error.message == "Request timeout expired"  # Triton's text (runtime shed)
    finally:
        go.set()
        first.close()
        second.close()


def test_no_runtime_fails_a_sub_call_at_its_deadline(repo: Path) -> None:
    """A runtime that is not there (restarting) holds a sub-call up to its deadline only."""
    key = f"{os.getpid()}-999"  # no runtime listens at this key's address
    calls = ChannelCalls(repo, ["affine"], key=key)
    try:
        started = time.monotonic()
        with pytest.raises(HloserveError, match="runtime not reachable") as info:
            calls.send("affine", {"x": EXPECTED["x"]}, [], 200_000)
        assert time.monotonic() - started < 5  # not the callee's runtime_wait_s (120 s)
        assert info.value.status is Status.DEADLINE_EXCEEDED
    finally:
        calls.close()


def test_a_sub_call_runs_before_the_callees_queued_requests(
    repo: Path, server: RuntimeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committed sub-calls (docs/scheduling.md, "The loop"): three requests of the callee of 2
    rows each (each fills affine's largest compiled size, 2) are queued; a meta's sub-call of
    1 row queued after them runs first, alone. The runtime's loop keeps reading its
    connections meanwhile; only its scheduler hands out no batch until all four are queued."""
    calls = ChannelCalls(repo, ["affine"], key=server.key)
    args = front_args(repo, "affine")
    assert args is not None
    bundle = FrontModel.from_args(args).bundle.path  # the meta's bundle copy: one queue
    one, two = EXPECTED["x"][:1], np.repeat(EXPECTED["x"][:1], 2, axis=0)
    runtime = server.core
    assert isinstance(runtime, RecordingRuntime)

    def wait_queued(n: int) -> None:
        end = time.monotonic() + 30
        while sum(m.queued for m in server.scheduler.snapshot().models.values()) < n:
            assert time.monotonic() < end
            time.sleep(0.005)

    try:
        calls.send("affine", {"x": one}, [], 0)  # connected and loaded
        with front(server, "affine", bundle) as plain:
            real = server.scheduler.next
            monkeypatch.setattr(server.scheduler, "next", lambda timeout=None: None)
            threads = [threading.Thread(target=plain.execute, args=([{"x": two}] * 3,))]
            threads[0].start()
            wait_queued(3)
            threads.append(threading.Thread(target=calls.send, args=("affine", {"x": one}, [], 0)))
            threads[1].start()
            wait_queued(4)
            monkeypatch.setattr(server.scheduler, "next", real)
            for thread in threads:
                thread.join(30)
            assert [c.batch_size for c in runtime.calls] == [1, 2, 2, 2]
    finally:
        calls.close()
