"""Many sequences at once behind a real tritonserver.

The accumulator (tests/accumulator_bundle.py) built with a ``sequence`` section: 64 candidate
sequences, a 5 s idle timeout (the runtime keeps the state that long too), compiled
at batch sizes 1 and 64. 64 sequences stepped together each keep their own sum, and the
runtime's execution counters give a mean executed batch of at least 8.
"""

from __future__ import annotations

import importlib.util
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hloserve import metric_names
from hloserve.node import tritonserver as ts
from tests.accumulator_bundle import WIDTH, export_accumulator
from tests.conftest import serving_options

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.skipif(
        importlib.util.find_spec("pytriton") is None, reason="nvidia-pytriton not installed"
    ),
]

SEQUENCES = 64
ROUNDS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ts.TritonServer]:
    from hloserve.bundle.manifest_sections import Sequencing
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.validate import validate_repository

    root = tmp_path_factory.mktemp("sequences")
    sequencing = Sequencing(
        max_candidate_sequences=SEQUENCES,
        max_sequence_idle_microseconds=5_000_000,
    )
    export_accumulator(root / "bundles" / "acc", [1, SEQUENCES], sequencing)
    # 1 s: time for one Python client to send a step of all 64 sequences (2 busy cores)
    build_repository(root / "bundles", root / "repo", max_queue_delay_us=1_000_000)
    assert validate_repository(root / "repo") == []
    with ts.TritonServer(serving_options(root / "repo", root / "tritonserver.log")) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: ts.TritonServer) -> Iterator[Any]:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.urls.grpc) as client:
        yield client


def _x(value: float) -> Any:
    import tritonclient.grpc as grpcclient

    x = np.full((1, WIDTH), value, np.float32)
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def _counters(server: ts.TritonServer) -> tuple[float, float]:
    """(executions, items executed) of ``acc``, from the runtime's counters."""
    from prometheus_client.parser import text_string_to_metric_families

    assert server.urls.metrics is not None
    with urllib.request.urlopen(f"http://{server.urls.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    executions = items = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != "acc" or not sample.name.endswith("_total"):
                continue
            if sample.name == metric_names.EXECUTIONS:
                executions += sample.value
            elif sample.name == "hloserve_execution_items_total":
                items += sample.value
    return executions, items


def test_an_idle_sequence_lives_for_the_models_idle_timeout(client: Any) -> None:
    """5 s, not Triton's default 1 s: 2 s idle keeps the sum."""

    def step(sequence: int, value: float, **flags: bool) -> float:
        result = client.infer("acc", _x(value), sequence_id=sequence, client_timeout=60, **flags)
        return float(result.as_numpy("y")[0, 0])

    assert step(7, 1.0, sequence_start=True) == 1.0
    time.sleep(2.0)
    assert step(7, 2.0, sequence_end=True) == 3.0


def test_64_sequences_run_with_a_mean_executed_batch_of_at_least_8(
    server: ts.TritonServer, client: Any
) -> None:
    ids = list(range(1000, 1000 + SEQUENCES))
    before, end = None, time.monotonic() + 10
    while time.monotonic() < end:  # the counters are published once a second: settled
        now = _counters(server)
        if now == before:
            break
        before = now
        time.sleep(1.1)
    assert before is not None
    done: dict[int, Any] = {}
    for round_ in range(ROUNDS):
        for n, sequence in enumerate(ids):
            client.async_infer(
                "acc",
                _x(float(n + round_)),
                callback=lambda result, error, s=sequence: done.__setitem__(s, (result, error)),
                sequence_id=sequence,
                sequence_start=round_ == 0,
                sequence_end=round_ == ROUNDS - 1,
                client_timeout=60,
            )
        deadline = time.monotonic() + 60
        while len(done) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.005)
        for n, sequence in enumerate(ids):
            result, error = done.pop(sequence)
            assert error is None, error
            expected = sum(n + r for r in range(round_ + 1))
            assert float(result.as_numpy("y")[0, 0]) == expected, (sequence, round_)
    end = time.monotonic() + 10
    after = before
    while time.monotonic() < end:  # the counters are published once a second
        after = _counters(server)
        if after[1] - before[1] >= SEQUENCES * ROUNDS:
            break
        time.sleep(0.2)
    executions, items = after[0] - before[0], after[1] - before[1]
    assert items == SEQUENCES * ROUNDS, (before, after)
    mean = items / executions
    print(f"{SEQUENCES} sequences x {ROUNDS} steps: {executions:g} executions, mean {mean:.1f}")
    assert mean >= 8, (before, after)
