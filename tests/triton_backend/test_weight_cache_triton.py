"""On-demand weights behind a real tritonserver: six models over a budget, metrics on :8002.

Repository (``hloserve repo build --residency m0=device``, then its budget lowered to 2 models'
weights in the config, as ``repo build`` refuses a budget ``huge`` can never fit):
    m0..m5  ``y = x + sum(w)``, ``w`` 256 KiB of f32 all ``i + 1`` (1.5 MiB in all: 3x the
            budget); m0 pinned on the device, so one on-demand model fits at a time
    huge    1 MiB of weights, more than the whole budget: its load fails with both sizes, the
            others serve
Four client threads send a seeded random mix of 300 requests (bounded in time); the metrics
endpoint is read between requests.
"""

from __future__ import annotations

import importlib.util
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hloserve.node import tritonserver as ts
from tests.conftest import serving_options
from tests.triton_backend.test_weight_cache_runtime import (
    MODEL_BYTES,
    WEIGHT_ITEMS,
    expected_y,
    export_weighted,
)

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.skipif(
        importlib.util.find_spec("pytriton") is None, reason="nvidia-pytriton not installed"
    ),
]

MODELS = [f"m{i}" for i in range(6)]
BUDGET = 2 * MODEL_BYTES
REQUESTS = 300
THREADS = 4
DEADLINE_S = 240.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ts.TritonServer]:
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.build_options import WeightCacheOptions

    root = tmp_path_factory.mktemp("weight_cache_triton")
    bundles = root / "bundles"
    for i, name in enumerate(MODELS):
        export_weighted(bundles / name, i + 1)
    export_weighted(bundles / "huge", 7, items=4 * WEIGHT_ITEMS)
    repo = root / "repo"
    # `repo build` refuses a budget 'huge' can never fit, so build with room for it and lower
    # the budget in the config afterwards, as a hand-edited repository (or a fraction budget on
    # a small GPU) would: the load-time check is what this module tests.
    roomy = BUDGET + 4 * WEIGHT_ITEMS * 4
    build_repository(
        bundles,
        repo,
        front_instances=1,
        weight_cache=WeightCacheOptions(weight_cache_bytes=roomy, residency={"m0": "device"}),
    )
    config = repo / "hloserve_runtime" / "config.pbtxt"
    text = config.read_text()
    assert text.count(f'"{roomy}"') == 1, text
    config.write_text(text.replace(f'"{roomy}"', f'"{BUDGET}"'))
    with ts.TritonServer(serving_options(repo, root / "tritonserver.log")) as server:
        yield server


def _metrics(server: ts.TritonServer) -> dict[tuple[str, str], float]:
    """hloserve_* samples by (sample name, model label or "")."""
    from prometheus_client.parser import text_string_to_metric_families

    assert server.urls.metrics is not None
    with urllib.request.urlopen(f"http://{server.urls.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("hloserve_weight"):
                assert set(sample.labels) <= {"model", "residency", "le"}, sample
                out[(sample.name, sample.labels.get("model", ""))] = sample.value
    return out


def _infer(client: Any, model: str, x: np.ndarray) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model, [tensor], client_timeout=60)
    return np.asarray(result.as_numpy("y"))


def test_six_models_over_budget_from_four_threads(server: ts.TritonServer) -> None:
    import tritonclient.grpc as grpcclient

    start = _metrics(server)
    assert start[("hloserve_weight_cache_budget_bytes", "")] == BUDGET
    assert start[("hloserve_weight_loads_total", "m0")] == 1  # pinned: loaded at start
    errors: list[str] = []
    peaks: list[float] = []
    counts = [0] * THREADS
    deadline = time.monotonic() + DEADLINE_S

    def client_thread(k: int) -> None:
        rng = np.random.default_rng(100 + k)
        with grpcclient.InferenceServerClient(server.urls.grpc) as client:
            for _ in range(REQUESTS // THREADS):
                if time.monotonic() > deadline:
                    errors.append(f"thread {k}: deadline")
                    return
                i = int(rng.integers(0, len(MODELS)))
                x = rng.integers(-100, 100, (1, 4)).astype(np.float32)
                try:
                    y = _infer(client, MODELS[i], x)
                except Exception as exc:
                    errors.append(f"thread {k} {MODELS[i]}: {exc}")
                    return
                if not np.array_equal(y, expected_y(x, i + 1)):
                    errors.append(f"thread {k} {MODELS[i]}: {y} != {expected_y(x, i + 1)}")
                counts[k] += 1
                peaks.append(_metrics(server)[("hloserve_weight_cache_resident_bytes", "")])

    threads = [threading.Thread(target=client_thread, args=(k,)) for k in range(THREADS)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DEADLINE_S + 30)
    seconds = time.perf_counter() - began
    assert not errors, errors[:5]
    assert sum(counts) == REQUESTS
    end = _metrics(server)
    loads = {m: end[("hloserve_weight_loads_total", m)] for m in MODELS}
    evictions = {m: end[("hloserve_weight_evictions_total", m)] for m in MODELS}
    print(
        f"{REQUESTS} requests from {THREADS} threads in {seconds:.1f} s; resident peak "
        f"{max(peaks):.0f} of {BUDGET} bytes; loads {loads}; evictions {evictions}"
    )
    assert max(peaks) <= BUDGET
    assert end[("hloserve_weight_cache_resident_bytes", "")] <= BUDGET
    assert loads["m0"] == 1 and evictions["m0"] == 0  # pinned: never evicted
    assert end[("hloserve_weight_resident_bytes", "m0")] == MODEL_BYTES
    assert sum(evictions.values()) > 0
    assert any(loads[m] > 1 for m in MODELS[1:])  # reloads after evictions
    assert end[("hloserve_weight_load_seconds_count", "m1")] == loads["m1"]


def test_hloserve_status_prints_the_cache(
    server: ts.TritonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from hloserve.cli import main

    assert server.urls.metrics is not None
    assert main(["status", server.urls.metrics]) == 0
    out = capsys.readouterr().out
    print(out)
    lines = out.splitlines()
    assert lines[0].startswith("weight cache: budget 512.0 KiB, resident ")
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert sorted(rows) == ["huge", *MODELS]
    assert rows["huge"][1:3] == ["-", "-"]  # never registered: its load failed
    assert rows["m0"][1:5] == ["device", "256.0", "KiB", "256.0"]
    assert rows["m1"][1] == "system"


def test_model_over_budget_fails_with_both_sizes_others_serve(server: ts.TritonServer) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from hloserve.model_control import grpc_metadata

    x = np.zeros((1, 4), np.float32)
    with grpcclient.InferenceServerClient(server.urls.grpc) as client:
        # READY means servable: the front's load fails with the runtime's reason
        # (docs/serving.md), so Triton shows the model UNAVAILABLE with that text
        headers = dict(grpc_metadata(server.options.model_control_key))
        index = client.get_model_repository_index(headers=headers, as_json=True)
        (huge,) = [m for m in index["models"] if m["name"] == "huge"]
        message = huge.get("reason", "")
        assert huge.get("state") == "UNAVAILABLE", huge
        assert str(4 * MODEL_BYTES) in message and str(BUDGET) in message, message
        assert "model 'huge' failed to load" in message, message
        with pytest.raises(InferenceServerException):
            _infer(client, "huge", x)
        np.testing.assert_array_equal(_infer(client, "m2", x), expected_y(x, 3))
    assert ("hloserve_weight_loads_total", "huge") in _metrics(server)
    assert _metrics(server)[("hloserve_weight_loads_total", "huge")] == 0
