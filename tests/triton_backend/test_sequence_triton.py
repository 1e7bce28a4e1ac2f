"""Stateful bundles behind a real tritonserver: Triton's sequence batcher, state in the runtime.

The ``accumulator`` bundle (tests/accumulator_bundle.py) returns each sequence's running sum:
two interleaved sequences keep separate sums, START resets one, and the runtime's
``hloserve_sequence_state_bytes`` gauge is live sequences x state bytes, 0 after END. The
server's device reports memory statistics (faked at JAX's device: ``HLOSERVE_FAKE_MEMORY_STATS``,
a 1 GiB card) so the state counts against the device budget; a test shrinks the card until only
3 more sequences fit.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import metric_names
from hloserve.node import tritonserver as ts
from hloserve.triton_backend.runtime.device_memory import FAKE_STATS_ENV, MARGIN
from tests.accumulator_bundle import STATE_BYTES, WIDTH, export_accumulator, infer_step
from tests.conftest import serving_options

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.skipif(
        importlib.util.find_spec("pytriton") is None, reason="nvidia-pytriton not installed"
    ),
]


#: the faked card's allocator limit (bytes) while no test shrinks it
LIMIT = 1 << 30


def _card(path: Path, limit: int) -> None:
    path.write_text(json.dumps({"bytes_limit": limit, "bytes_in_use": 0}))


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("card") / "stats.json"
    _card(path, LIMIT)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, stats_file: Path) -> Iterator[ts.TritonServer]:
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.validate import validate_repository

    root = tmp_path_factory.mktemp("sequence")
    export_accumulator(root / "bundles" / "accumulator")
    # 50 ms: time for a Python client to send 8 steps before the batch goes out
    build_repository(root / "bundles", root / "repo", max_queue_delay_us=50_000)
    assert validate_repository(root / "repo") == []  # `hloserve repo validate` agrees
    options = serving_options(root / "repo", root / "tritonserver.log")
    options = dataclasses.replace(options, env={**options.env, FAKE_STATS_ENV: str(stats_file)})
    with ts.TritonServer(options) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: ts.TritonServer) -> Iterator[Any]:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.urls.grpc) as client:
        yield client


def _state_bytes(server: ts.TritonServer) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    assert server.urls.metrics is not None
    with urllib.request.urlopen(f"http://{server.urls.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, model = sample.name, sample.labels.get("model")
            if name == metric_names.SEQUENCE_STATE_BYTES and model == "accumulator":
                return float(sample.value)
    return None


def _wait_gauge(
    server: ts.TritonServer, expected: float, keep: Any = None, timeout_s: float = 10.0
) -> None:
    """Wait for the gauge to read ``expected``, calling ``keep()`` meanwhile (a live sequence
    idle for 1 s, the idle timeout, would be dropped)."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        if keep is not None:
            keep()
        seen = _state_bytes(server)
        if seen == expected:
            return
        time.sleep(0.2)
    raise AssertionError(f"{metric_names.SEQUENCE_STATE_BYTES} is {seen}, expected {expected}")


def test_interleaved_sequences_keep_separate_state(server: ts.TritonServer, client: Any) -> None:
    assert infer_step(client, 11, 1.0, start=True) == 1.0
    assert infer_step(client, 22, 10.0, start=True) == 10.0
    assert infer_step(client, 11, 2.0) == 3.0
    assert infer_step(client, 22, 20.0) == 30.0
    assert infer_step(client, 11, 3.0) == 6.0

    def keep_both() -> None:  # adding 0 keeps a sequence live and its sum as it is
        assert (infer_step(client, 11, 0.0), infer_step(client, 22, 0.0)) == (6.0, 30.0)

    _wait_gauge(server, 2 * STATE_BYTES, keep_both)
    assert infer_step(client, 11, 4.0, end=True) == 10.0
    _wait_gauge(server, STATE_BYTES, lambda: infer_step(client, 22, 0.0))
    assert infer_step(client, 22, 30.0, end=True) == 60.0
    _wait_gauge(server, 0.0)


def test_an_idle_sequence_is_dropped(server: ts.TritonServer, client: Any) -> None:
    from tritonclient.utils import InferenceServerException

    assert infer_step(client, 44, 2.0, start=True) == 2.0
    _wait_gauge(server, STATE_BYTES)  # within the 1 s idle timeout, or the assert below holds
    _wait_gauge(server, 0.0)  # idle longer than max_sequence_idle_microseconds (1 s)
    with pytest.raises(InferenceServerException) as info:
        infer_step(client, 44, 1.0)
    assert "START" in str(info.value), info.value


def test_start_resets_a_sequence(client: Any) -> None:
    assert infer_step(client, 33, 5.0, start=True) == 5.0
    assert infer_step(client, 33, 5.0) == 10.0
    assert infer_step(client, 33, 7.0, start=True) == 7.0  # the same ID started again: from zero
    assert infer_step(client, 33, 1.0, end=True) == 8.0


def test_string_sequence_ids_keep_their_own_state(client: Any) -> None:
    """Triton's sequence examples send a UUID ``sequence_id`` to the model they sent integer
    IDs (tritonserver 2.51 wrote a string ID past the 8 bytes of a UINT64 CORRID tensor and the
    model's stub died): string IDs are sequences of their own, "55" apart from 55, and the
    server serves on."""
    from tritonclient.utils import InferenceServerException

    uuid_id, long_id = str(uuid.uuid4()), "s" * 128  # 128 characters: Triton's longest
    assert infer_step(client, 55, 1.0, start=True) == 1.0
    assert infer_step(client, uuid_id, 10.0, start=True) == 10.0
    assert infer_step(client, long_id, 100.0, start=True) == 100.0
    assert infer_step(client, "55", 1000.0, start=True) == 1000.0
    assert infer_step(client, uuid_id, 20.0) == 30.0
    assert infer_step(client, 55, 2.0) == 3.0
    assert infer_step(client, long_id, 200.0, end=True) == 300.0
    assert infer_step(client, "55", 1.0, end=True) == 1001.0
    assert infer_step(client, uuid_id, 30.0, end=True) == 60.0
    with pytest.raises(InferenceServerException) as info:  # Triton's own limit
        infer_step(client, "s" * 129, 1.0, start=True)
    assert "128" in str(info.value), info.value
    assert infer_step(client, 55, 3.0, end=True) == 6.0
    assert client.is_server_live() and client.is_model_ready("accumulator")


def test_a_request_without_a_sequence_is_refused(client: Any) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    x = np.ones((1, WIDTH), np.float32)
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as info:
        client.infer("accumulator", [tensor], client_timeout=60)
    assert "correlation ID" in str(info.value)  # Triton refuses it before the front


def _executions(server: ts.TritonServer) -> dict[int, float]:
    """``hloserve_executions_total`` of the accumulator by batch size."""
    from prometheus_client.parser import text_string_to_metric_families

    assert server.urls.metrics is not None
    with urllib.request.urlopen(f"http://{server.urls.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(metric_names.EXECUTIONS) and (
                sample.labels.get("model") == "accumulator"
            ):
                out[int(sample.labels["batch_size"])] = float(sample.value)
    return out


def test_sequences_coalesce_with_state_per_row(server: ts.TritonServer, client: Any) -> None:
    """8 sequences stepped at once run in shared executions, each row with its own state."""
    import tritonclient.grpc as grpcclient

    ids = list(range(101, 109))
    for i in ids:
        assert infer_step(client, i, float(i), start=True) == float(i)
    before = _executions(server)
    done: dict[int, Any] = {}
    for round_ in range(1, 4):
        pending = []
        for i in ids:
            x = np.full((1, WIDTH), float(round_), np.float32)
            tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            pending.append(i)
            client.async_infer(
                "accumulator",
                [tensor],
                callback=lambda result, error, i=i: done.__setitem__(i, (result, error)),
                sequence_id=i,
                sequence_end=round_ == 3,
                client_timeout=60,
            )
        deadline = time.monotonic() + 60
        while len(done) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in ids:
            result, error = done.pop(i)
            assert error is None, error
            expected = i + round_ * (round_ + 1) / 2  # i, then + 1, + 2, + 3
            assert float(result.as_numpy("y")[0, 0]) == expected
    time.sleep(1.5)  # the counters are published once a second
    after = _executions(server)
    coalesced = after.get(8, 0) - before.get(8, 0)
    print(f"executions by batch size: before {before}, after {after}")
    assert coalesced >= 1, (before, after)


def test_a_sequence_beyond_the_device_budget_is_refused_unavailable(
    server: ts.TritonServer, client: Any, stats_file: Path
) -> None:
    """The card shrunk (the faked ``bytes_limit``) until the weight budget, less the state,
    holds the accumulator's weights and 3 sequences' state: a 4th START is refused with
    UNAVAILABLE naming the budget, and fits again once a sequence ends."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from hloserve.prometheus_text import cache_status, fetch_metrics

    assert server.urls.metrics is not None
    _wait_gauge(server, 0.0)
    device = cache_status(fetch_metrics(f"http://{server.urls.metrics}/metrics")).device
    weights = 4 * WIDTH  # the accumulator's one weight, f32[WIDTH]
    # limit - margin - executables - scratch - weights leaves room for 3.5 sequences' state
    need = int(device["executables"] + device["scratch"]) + weights + 3 * STATE_BYTES + 8
    limit = next(n for n in range(need, 2 * need) if n - int(MARGIN * n) >= need)
    try:
        _card(stats_file, limit)
        for i in (201, 202, 203):
            assert infer_step(client, i, 1.0, start=True) == 1.0
        with pytest.raises(InferenceServerException) as info:
            infer_step(client, 204, 1.0, start=True)
        assert info.value.status() == str(grpcclient.grpc.StatusCode.UNAVAILABLE), info.value
        message = str(info.value)
        assert "does not fit the device budget" in message and "sequence state" in message
        assert infer_step(client, 201, 1.0, end=True) == 2.0
        assert infer_step(client, 204, 5.0, start=True) == 5.0  # room again after END
        for i in (202, 203, 204):
            infer_step(client, i, 0.0, end=True)
    finally:
        _card(stats_file, LIMIT)


def test_a_reload_ends_the_live_sequences_with_a_clear_error(
    server: ts.TritonServer, client: Any
) -> None:
    """A hot reload starts a new sequence batcher: a live sequence's next request is refused
    (it must START again), its state is freed with the old version, and new sequences run."""
    import os

    from tritonclient.utils import InferenceServerException

    from hloserve.model_control import grpc_metadata

    assert infer_step(client, 501, 1.0, start=True) == 1.0
    assert infer_step(client, 501, 2.0) == 3.0
    repo = Path(server.options.model_repository) / "accumulator"
    now = time.time()
    for path in [repo / "config.pbtxt", *repo.glob("*/bundle/manifest.yaml")]:
        os.utime(path, (now, now))  # a new generation of the same bundle
    client.load_model("accumulator", headers=dict(grpc_metadata(server.options.model_control_key)))
    with pytest.raises(InferenceServerException) as info:
        infer_step(client, 501, 3.0)
    print(f"after the reload: {info.value}")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value
    assert "START" in str(info.value), info.value
    _wait_gauge(server, 0.0)  # the old version's state went with it
    assert infer_step(client, 502, 4.0, start=True) == 4.0
    assert infer_step(client, 502, 1.0, end=True) == 5.0
