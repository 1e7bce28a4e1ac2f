"""Every dashboard panel's PromQL, evaluated by a real Prometheus scraping a running node.

``hloserve serve BUNDLES --workers 2`` (two tritonservers, the gateway, the supervisor's admin
port) writes its scrape targets into a directory that a Prometheus started here (Debian's
``prometheus``, scripts/prometheus.sh) discovers with ``file_sd_configs``. Traffic goes through
the gateway to two bundles whose weights do not fit the weight cache together (evictions) and
to a meta model; counters of rarer events (restarts, failovers, sheds) exist from the start
at zero. Then every
expression of every panel, its template variables expanded to "All", must return a non-empty
result through Prometheus's HTTP API: a panel naming a metric the code does not export fails.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.ports import free_ports
from tests.conftest import import_example
from tests.node.test_serve_cli import serve_two_workers, wait_for_line

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]
grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("grafana_foundation_sdk")

PROMETHEUS = shutil.which("prometheus")


def _query(port: int, expr: str) -> list[Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert body["status"] == "success", body
    result: list[Any] = body["data"]["result"]
    return result


@pytest.fixture(scope="module")
def node(digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if PROMETHEUS is None:
        pytest.fail("Debian's prometheus is not installed (scripts/prometheus.sh installs it)")
    root = tmp_path_factory.mktemp("observe")
    bundles = root / "bundles"
    bundles.mkdir()
    for name in ("digits", "digits2"):
        shutil.copytree(digits_bundle, bundles / name)
    cascade = import_example("digits_cascade", "export")
    cascade.export_fast(bundles)
    cascade.write_meta(bundles)
    weights = (digits_bundle / "weights.safetensors").stat().st_size
    targets = root / "targets"
    admin, prom = free_ports(2)
    log = root / "serve.log"
    serve, grpc, _, _ = serve_two_workers(
        bundles, log, "--admin-port", str(admin), "--weight-cache-bytes", str(int(weights * 1.6)),
        env={"HLOSERVE_PROMETHEUS_TARGETS_DIR": str(targets)},
    )  # fmt: skip
    config = root / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: hloserve\n"
        "    honor_labels: true\n"
        f"    file_sd_configs: [{{files: ['{targets}/*.json'], refresh_interval: 1s}}]\n"
    )
    with (root / "prometheus.log").open("wb") as out:
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom}"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_line(log, r"hloserve: ready after", serve, 300)
        yield {"serve": serve, "log": log, "grpc": grpc, "prom": prom, "targets": targets}
    finally:
        prometheus.send_signal(signal.SIGTERM)
        serve.send_signal(signal.SIGTERM)
        for proc in (prometheus, serve):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _traffic(grpc: int, seconds: float) -> int:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    image = np.random.default_rng(0).random((3, 8, 8, 1), dtype=np.float32)
    sent, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline and sent < 2000:
        for model in ("digits", "digits2", "digits_cascade"):
            tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            client.infer(model, [tensor])
            sent += 1
    return sent


def test_the_node_writes_its_targets(node: Any) -> None:
    files = list(node["targets"].glob("*.json"))
    assert len(files) == 1
    jobs = sorted(g["labels"]["job"] for g in json.loads(files[0].read_text()))
    assert jobs == ["hloserve-gateway", "hloserve-node", "hloserve-worker", "hloserve-worker"]


def test_every_panel_returns_data(node: Any) -> None:
    from hloserve.observability.dashboards import DASHBOARDS, expand

    assert _traffic(node["grpc"], 20) > 0  # digits and digits2 evict each other
    time.sleep(3)  # two more scrapes
    empty = []
    for dashboard in DASHBOARDS:
        for panel in dashboard.panels:
            empty += [
                f"{dashboard.name} / {panel.title}: {expr}"
                for expr in panel.exprs
                if not _query(node["prom"], expand(expr))
            ]
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_targets_are_removed_at_stop(node: Any) -> None:
    node["serve"].send_signal(signal.SIGTERM)
    node["serve"].wait(timeout=120)
    assert list(node["targets"].glob("*.json")) == []
