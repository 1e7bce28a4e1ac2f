"""Observability pieces without a Prometheus: target files, dashboards, the node's admin port."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")  # the numpy-2 leg has no serving dependencies

from hloserve.observability.supervisor import NodeAdminServer, NodeMetrics
from hloserve.observability.targets import (
    GATEWAY_JOB,
    NODE_JOB,
    WORKER_JOB,
    NodeTargets,
    targets_dir,
    write_targets,
)

ROOT = Path(__file__).resolve().parents[2]


def test_targets_dir_follows_the_environment(tmp_path: Path) -> None:
    assert targets_dir({"HLOSERVE_PROMETHEUS_TARGETS_DIR": str(tmp_path)}) == tmp_path
    assert targets_dir({"XDG_STATE_HOME": "/s"}) == Path("/s/hloserve/prometheus")
    assert targets_dir({}) == Path.home() / ".local/state/hloserve/prometheus"


def test_target_file_lists_workers_gateway_and_supervisor(tmp_path: Path) -> None:
    targets = NodeTargets(
        "serve-8001",
        ["127.0.0.1:8102", "127.0.0.1:8105"],
        gateway="127.0.0.1:8002",
        supervisor="127.0.0.1:8003",
    )
    path = write_targets(targets, tmp_path)
    assert path == tmp_path / "serve-8001.json"
    groups = json.loads(path.read_text())
    assert groups == [
        {
            "targets": ["127.0.0.1:8102"],
            "labels": {"node": "serve-8001", "job": WORKER_JOB, "worker": "worker0"},
        },
        {
            "targets": ["127.0.0.1:8105"],
            "labels": {"node": "serve-8001", "job": WORKER_JOB, "worker": "worker1"},
        },
        {"targets": ["127.0.0.1:8002"], "labels": {"node": "serve-8001", "job": GATEWAY_JOB}},
        {"targets": ["127.0.0.1:8003"], "labels": {"node": "serve-8001", "job": NODE_JOB}},
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["serve-8001.json"]  # no temporary left


def test_node_admin_port_serves_the_supervisor_metrics() -> None:
    metrics = NodeMetrics(["worker0", "worker1"])
    metrics.workers_up.set(2)
    metrics.restarts.labels(worker="worker1").inc()
    metrics.stub_reloads.labels(worker="worker0", model="digits").inc()
    server = NodeAdminServer(metrics, "127.0.0.1", 0)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok\n"
    finally:
        server.close()
    assert "hloserve_node_workers 2.0" in text and "hloserve_node_workers_up 2.0" in text
    assert 'hloserve_node_worker_restarts_total{worker="worker0"} 0.0' in text
    assert 'hloserve_node_worker_restarts_total{worker="worker1"} 1.0' in text
    assert 'hloserve_node_stub_reloads_total{model="digits",worker="worker0"} 1.0' in text


def test_dashboards_are_checked_in_as_generated() -> None:
    pytest.importorskip("grafana_foundation_sdk")
    from hloserve.observability.dashboards import drift

    assert drift(ROOT / "containers" / "grafana" / "dashboards") == []


def test_every_panel_queries_something_and_has_a_unit() -> None:
    pytest.importorskip("grafana_foundation_sdk")
    from hloserve.observability.dashboards import DASHBOARDS, build, expand

    assert len(DASHBOARDS) == 7
    for spec in DASHBOARDS:
        board = build(spec)
        assert board["uid"] == f"hloserve-{spec.name}"
        assert [p["title"] for p in board["panels"]] == [p.title for p in spec.panels]
        for panel in board["panels"]:
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])
            for target in panel["targets"]:
                assert "$" not in expand(target["expr"])
        names = {v["name"] for v in board["templating"]["list"]}
        used = {
            var
            for p in spec.panels
            for e in p.exprs
            for var in ("node", "worker", "model")
            if f"${var}" in e
        }
        assert used <= names, (spec.name, used - names)


def test_drift_names_a_changed_file(tmp_path: Path) -> None:
    pytest.importorskip("grafana_foundation_sdk")
    from hloserve.observability.dashboards import drift, write_dashboards

    files = write_dashboards(tmp_path)
    assert drift(tmp_path) == []
    files[0].write_text("{}")
    (tmp_path / "hloserve-old.json").write_text("{}")
    problems = drift(tmp_path)
    assert problems == [
        f"{files[0]}: differs from hloserve.observability.dashboards",
        f"{tmp_path / 'hloserve-old.json'}: no dashboard of that name",
    ]
