"""The executable cache behind a real tritonserver: the second start loads, the answers agree.

One repository (bundles ``tiny``, batch sizes 1 and 4, and the golden ``affine``, 1 and 2: four
executables) built with ``--executable-cache`` set to a fresh directory, served twice in turn.
The first start compiles all four and writes them; the second loads all four from the cache,
as its start log and ``hloserve_executables_total{source}`` say, and answers byte for byte as
the first did.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from hloserve.node import tritonserver as ts
from tests.conftest import GOLDEN, serving_options

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.skipif(
        importlib.util.find_spec("pytriton") is None, reason="nvidia-pytriton not installed"
    ),
]

grpcclient = pytest.importorskip("tritonclient.grpc")

SUMMARY = re.compile(
    r"executables: (\d+) compiled \([\d.]+ s\), (\d+) loaded from the cache \([\d.]+ s\); cache "
)


def executables_total(server: ts.TritonServer) -> dict[tuple[str, str], float]:
    """hloserve_executables_total by (model, source)."""
    from prometheus_client.parser import text_string_to_metric_families

    assert server.urls.metrics is not None
    with urllib.request.urlopen(f"http://{server.urls.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.labels["model"], s.labels["source"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "hloserve_executables_total"
    }


def answers(server: ts.TritonServer) -> list[np.ndarray]:
    client = grpcclient.InferenceServerClient(server.urls.grpc)
    rng = np.random.default_rng(7)
    out = []
    for model, batch in (("tiny", 1), ("tiny", 4), ("affine", 1), ("affine", 2)):
        x = grpcclient.InferInput("x", [batch, 4], "FP32")
        x.set_data_from_numpy(rng.standard_normal((batch, 4)).astype(np.float32))
        result = client.infer(model, [x])
        config = client.get_model_config(model, as_json=True)["config"]
        out += [result.as_numpy(o["name"]) for o in config["output"]]
    client.close()
    return out


def test_second_start_loads_every_executable_from_the_cache(
    tiny_bundle_src: Path, tmp_path: Path
) -> None:
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.build_options import ExecutableCacheOptions

    bundles = tmp_path / "bundles"
    shutil.copytree(tiny_bundle_src, bundles / "tiny")
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    cache = tmp_path / "executables"
    repo = tmp_path / "repo"
    build_repository(
        bundles,
        repo,
        front_instances=1,
        executable_cache=ExecutableCacheOptions(directory=str(cache)),
    )
    seen: list[tuple[tuple[int, int], dict[tuple[str, str], float], list[np.ndarray]]] = []
    for start in ("first", "second"):
        log = tmp_path / f"{start}.log"
        with ts.TritonServer(serving_options(repo, log)) as server:
            got = answers(server)  # every model has loaded (fronts load their bundle lazily)
            metrics = executables_total(server)
            deadline = time.monotonic() + 20
            while len(metrics) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
                metrics = executables_total(server)
        found = SUMMARY.findall(log.read_text())  # one cumulative line per bundle loaded
        assert found, log.read_text()[-3000:]
        counts = (int(found[-1][0]), int(found[-1][1]))
        seen.append((counts, metrics, got))
        if start == "first":
            assert len(list(cache.glob("*.xexe"))) == 4
    (first, first_metrics, first_answers), (second, second_metrics, second_answers) = seen
    assert first == (4, 0) and second == (0, 4)
    assert first_metrics == {("tiny", "compiled"): 2.0, ("affine", "compiled"): 2.0}
    assert second_metrics == {("tiny", "cache"): 2.0, ("affine", "cache"): 2.0}
    for a, b in zip(first_answers, second_answers, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(first_answers) == 8  # two outputs per request
