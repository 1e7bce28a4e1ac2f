"""hloserve's Grafana dashboards, built with Grafana's ``grafana-foundation-sdk``.

Seven dashboards, one per question an operator asks (docs/observability.md): the fleet, one
worker, one model, the weight cache, the runtime's scheduler, the gateway's placement, meta
models. Every panel is a :class:`PanelSpec` in :data:`DASHBOARDS`; its PromQL expressions are
the ones the tests evaluate against a real Prometheus scraping a running node, with the
template variables expanded (:func:`expand`), so a panel naming a metric the code does not
export fails a test. ``python -m hloserve.observability dashboards --out DIR`` writes the JSON
(checked in under ``containers/grafana/dashboards``; ``--check`` fails when it drifts).

Template variables: ``$node`` (the ``node`` label the target files set), ``$worker`` (the
``worker`` label), ``$model`` (Triton's ``model`` label). All are multi-value with "All".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Dashboard uids are ``hloserve-<name>``; the tag groups them in Grafana.
TAG = "hloserve"
#: The provisioned Prometheus data source's uid (containers/grafana/provisioning).
DATASOURCE_UID = "hloserve-prometheus"

_W = '{node=~"$node", worker=~"$worker"}'
_WM = '{node=~"$node", worker=~"$worker", model=~"$model"}'
_M = '{node=~"$node", model=~"$model"}'
_N = '{node=~"$node"}'


@dataclass(frozen=True)
class PanelSpec:
    """One panel.

    Attributes:
        title: the panel title (what it answers).
        exprs: PromQL expressions, one series group each, with ``legend`` formats.
        unit: Grafana unit id (``reqps``, ``s``, ``bytes``, ``percentunit``, ``short``...).
        kind: ``timeseries``, ``stat`` or ``table``.
        legends: one Grafana legend format per expression (default ``{{model}}`` for the
            first: most panels draw one series per model).
        description: the hover text: what is measured and where it comes from.
    """

    title: str
    exprs: tuple[str, ...]
    unit: str = "short"
    kind: str = "timeseries"
    legends: tuple[str, ...] = ("{{model}}",)
    description: str = ""


@dataclass(frozen=True)
class DashboardSpec:
    """One dashboard: a name (uid ``hloserve-<name>``), a title, variables and panels."""

    name: str
    title: str
    panels: tuple[PanelSpec, ...]
    variables: tuple[str, ...] = ("node", "worker", "model")


def _rate(metric: str, selector: str, by: str = "model", window: str = "1m") -> str:
    return f"sum by ({by}) (rate({metric}{selector}[{window}]))"


def _per(metric: str, per: str, selector: str) -> str:
    """``metric``'s rate over ``per``'s, by model (e.g. duration per request)."""
    return f"{_rate(metric, selector)} / {_rate(per, selector)}"


#: Triton's count of successful requests.
_OK = "nv_inference_request_success"


DASHBOARDS: tuple[DashboardSpec, ...] = (
    DashboardSpec(
        "fleet",
        "hloserve / fleet",
        (
            PanelSpec(
                "Workers up",
                ('sum(up{job="hloserve-worker", node=~"$node"})',),
                kind="stat",
                legends=(),
                description="Workers whose Triton metrics endpoint answers the scrape.",
            ),
            PanelSpec(
                "Workers up (supervisor)",
                (f"sum(hloserve_node_workers_up{_N})",),
                kind="stat",
                legends=(),
                description="Workers the supervising process counts as running.",
            ),
            PanelSpec(
                "Worker restarts (1 h)",
                (f"sum by (worker) (increase(hloserve_node_worker_restarts_total{_N}[1h]))",),
                legends=("{{worker}}",),
                description="Restarts of a worker process or container, and of a dead model "
                "stub (the supervisor's watchdog reloads it).",
            ),
            PanelSpec(
                "Requests per second by model",
                (_rate(_OK, _M),),
                unit="reqps",
                description="Triton's successful inference requests, all workers.",
            ),
            PanelSpec(
                "Failed requests per second by model",
                (_rate("nv_inference_request_failure", _M),),
                unit="reqps",
            ),
            PanelSpec(
                "Requests per second by worker",
                (_rate(_OK, _N, by="worker"),),
                unit="reqps",
                legends=("{{worker}}",),
            ),
        ),
    ),
    DashboardSpec(
        "worker",
        "hloserve / worker",
        (
            PanelSpec("Requests per second", (_rate(_OK, _WM),), unit="reqps"),
            PanelSpec(
                "Runtime executions per second",
                (_rate("hloserve_executions_total", _WM),),
                unit="ops",
                description="Executions of compiled executables by the worker's one runtime.",
            ),
            PanelSpec(
                "Mean request latency",
                (_per("nv_inference_request_duration_us", _OK, _WM) + " / 1e6",),
                unit="s",
                description="Triton's cumulative request duration over its request count.",
            ),
            PanelSpec(
                "Weight cache resident vs budget",
                (
                    f"sum(hloserve_weight_cache_resident_bytes{_W})",
                    f"sum(hloserve_weight_cache_budget_bytes{_W})",
                ),
                unit="bytes",
                legends=("resident", "budget"),
            ),
        ),
    ),
    DashboardSpec(
        "model",
        "hloserve / model",
        (
            PanelSpec(
                "Requests per second",
                (_rate(_OK, _WM, by="model, worker"),),
                unit="reqps",
                legends=("{{model}} on {{worker}}",),
            ),
            PanelSpec(
                "Mean latency: total, queue, compute",
                tuple(
                    _per(m, _OK, _WM) + " / 1e6"
                    for m in (
                        "nv_inference_request_duration_us",
                        "nv_inference_queue_duration_us",
                        "nv_inference_compute_infer_duration_us",
                    )
                ),
                unit="s",
                legends=("{{model}} total", "{{model}} queue", "{{model}} compute"),
                description="Triton 2.51 has no latency histograms; these are its cumulative "
                "durations over its request count.",
            ),
            PanelSpec(
                "Mean executed batch (items per execution)",
                (_per("hloserve_execution_items_total", "hloserve_executions_total", _WM),),
                description="Real items per runtime execution, coalesced across front "
                "instances (padding excluded).",
            ),
            PanelSpec(
                "Padding waste",
                (
                    f"sum by (model) (rate(hloserve_execution_padding_total{_WM}[1m])) / "
                    f"(sum by (model) (rate(hloserve_execution_padding_total{_WM}[1m])) + "
                    f"sum by (model) (rate(hloserve_execution_items_total{_WM}[1m])))",
                ),
                unit="percentunit",
                description="Share of executed rows that were zero padding up to a compiled "
                "batch size.",
            ),
            PanelSpec(
                "Executions by compiled batch size",
                (_rate("hloserve_executions_total", _WM, by="model, batch_size"),),
                unit="ops",
                legends=("{{model}} b{{batch_size}}",),
            ),
        ),
    ),
    DashboardSpec(
        "weight-cache",
        "hloserve / weight cache",
        (
            PanelSpec(
                "Resident bytes vs budget",
                (
                    f"sum by (worker) (hloserve_weight_cache_resident_bytes{_W})",
                    f"sum by (worker) (hloserve_weight_cache_budget_bytes{_W})",
                ),
                unit="bytes",
                legends=("{{worker}} resident", "{{worker}} budget"),
            ),
            PanelSpec(
                "Resident bytes by model",
                (f"sum by (model) (hloserve_weight_resident_bytes{_WM})",),
                unit="bytes",
            ),
            PanelSpec(
                "Loads and evictions per second",
                (
                    _rate("hloserve_weight_loads_total", _WM),
                    _rate("hloserve_weight_evictions_total", _WM),
                ),
                unit="ops",
                legends=("{{model}} loads", "{{model}} evictions"),
            ),
            PanelSpec(
                "Hit ratio",
                (
                    f"1 - sum(rate(hloserve_weight_loads_total{_WM}[5m])) / "
                    f"sum(rate(hloserve_executions_total{_WM}[5m]))",
                ),
                unit="percentunit",
                legends=(),
                description="Executions that found their weights resident: one minus loads "
                "per execution.",
            ),
            PanelSpec(
                "Load bandwidth",
                (
                    f"sum(rate(hloserve_weight_load_bytes_total{_WM}[5m])) / "
                    f"sum(rate(hloserve_weight_load_seconds_sum{_WM}[5m]))",
                ),
                unit="Bps",
                legends=(),
                description="Bytes moved host-to-device per second of load time.",
            ),
        ),
    ),
    DashboardSpec(
        "scheduler",
        "hloserve / scheduler",
        (
            PanelSpec(
                "Queue depth",
                (f"sum by (model) (hloserve_scheduler_queue_depth{_WM})",),
                description="Requests waiting in the runtime's per-model queues.",
            ),
            PanelSpec(
                "Fair share vs recent compute",
                (
                    f"max by (model) (hloserve_scheduler_share{_WM})",
                    f"max by (model) (hloserve_scheduler_recent_compute_share{_WM})",
                ),
                unit="percentunit",
                legends=("{{model}} share", "{{model}} recent"),
                description="fair: weight / sum of weights against the model's share of the "
                "recent-compute EMA (docs/scheduling.md).",
            ),
            PanelSpec(
                "Learned execution cost",
                (f"max by (model, batch_size) (hloserve_scheduler_cost_seconds{_WM})",),
                unit="s",
                legends=("{{model}} b{{batch_size}}",),
                description="Cost EMA (alpha 0.2) per model, variant and batch size.",
            ),
            PanelSpec(
                "Shed requests per second",
                (_rate("hloserve_scheduler_shed_total", _WM, by="model, reason"),),
                unit="reqps",
                legends=("{{model}} {{reason}}",),
            ),
        ),
    ),
    DashboardSpec(
        "gateway",
        "hloserve / gateway placement",
        (
            PanelSpec(
                "Placement: workers per model",
                ('max by (model, worker) (hloserve_gateway_placement{node=~"$node"})',),
                kind="table",
                legends=("{{model}} -> {{worker}}",),
                description="The routing table: 1 where a model has a replica.",
            ),
            PanelSpec("Replicas", ('max by (model) (hloserve_gateway_replicas{node=~"$node"})',)),
            PanelSpec(
                "Routed requests per second (HAProxy)",
                (
                    "sum by (proxy, server) (rate(haproxy_server_http_responses_total"
                    '{node=~"$node", proxy=~"m_.+"}[1m]))',
                ),
                unit="reqps",
                legends=("{{proxy}} -> {{server}}",),
                description="HAProxy's data plane: backend m_<model>, server w<i> = worker i.",
            ),
            PanelSpec(
                "Upstream response time (HAProxy)",
                (
                    "max by (proxy, server) (haproxy_server_response_time_average_seconds"
                    '{node=~"$node", proxy=~"m_.+"})',
                ),
                unit="s",
                legends=("{{proxy}} -> {{server}}",),
                description="HAProxy's average over its last 1024 requests per server.",
            ),
            PanelSpec(
                "Failovers and refusals per second",
                (
                    "sum(rate(haproxy_backend_redispatch_warnings_total"
                    '{node=~"$node", proxy=~"m_.+"}[1m]))',
                    "sum(rate(haproxy_backend_retry_warnings_total"
                    '{node=~"$node", proxy=~"m_.+"}[1m]))',
                    "sum(rate(haproxy_backend_http_responses_total"
                    '{node=~"$node", proxy=~"m_.+", code="5xx"}[1m]))',
                ),
                unit="reqps",
                legends=("failovers (redispatched)", "retries", "refused or failed (5xx)"),
                description="A refused connection is redispatched to another replica; a "
                "request a worker may have run is never re-sent (docs/gateway.md).",
            ),
        ),
        variables=("node",),
    ),
    DashboardSpec(
        "meta",
        "hloserve / meta models",
        (
            PanelSpec(
                "Meta requests per second",
                (_rate(_OK, '{node=~"$node", model=~"$model"}'),),
                unit="reqps",
            ),
            PanelSpec(
                "Sub-calls per meta request",
                (_per("hloserve_meta_calls_total", "hloserve_meta_runs_total", _M),),
            ),
        ),
        variables=("node", "model"),
    ),
)

_VARIABLE_QUERIES = {
    "node": "label_values(up, node)",
    "worker": 'label_values(up{job="hloserve-worker"}, worker)',
    "model": "label_values(nv_inference_request_success, model)",
}


def expand(expr: str, values: Mapping[str, str] | None = None) -> str:
    """``expr`` with ``$var`` replaced by a regex value (default ``.*``, Grafana's "All")."""
    values = values or {}
    return re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), ".*"), expr)


def all_exprs() -> list[tuple[str, str, str]]:
    """``(dashboard, panel title, expr)`` for every expression of every panel."""
    return [(d.name, p.title, e) for d in DASHBOARDS for p in d.panels for e in p.exprs]


def build(spec: DashboardSpec) -> dict[str, Any]:
    """The dashboard's JSON model (Grafana dashboard schema), built with the foundation SDK."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    source = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
    board = (
        dashboard.Dashboard(spec.title)
        .uid(f"hloserve-{spec.name}")
        .tags([TAG])
        .refresh("10s")
        .time("now-30m", "now")
    )
    for name in spec.variables:
        board = board.with_variable(
            dashboard.QueryVariable(name)
            .query(_VARIABLE_QUERIES[name])
            .datasource(source)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    kinds: dict[str, Any] = {
        "timeseries": timeseries.Panel,
        "stat": stat.Panel,
        "table": table.Panel,
    }
    for panel in spec.panels:
        built = kinds[panel.kind]().title(panel.title).unit(panel.unit).datasource(source)
        if panel.description:
            built = built.description(panel.description)
        for i, expr in enumerate(panel.exprs):
            target = prometheus.Dataquery().expr(expr).ref_id(chr(ord("A") + i))
            if i < len(panel.legends):
                target = target.legend_format(panel.legends[i])
            built = built.with_target(target)
        board = board.with_panel(built)
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.build()))


def write_dashboards(out: Path) -> list[Path]:
    """Write every dashboard as ``<out>/hloserve-<name>.json``; returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for spec in DASHBOARDS:
        path = out / f"hloserve-{spec.name}.json"
        path.write_text(json.dumps(build(spec), indent=2, sort_keys=True) + "\n")
        files.append(path)
    return files


def drift(out: Path) -> list[str]:
    """Files under ``out`` that differ from what :func:`build` makes now (or are missing)."""
    problems = []
    expected = {f"hloserve-{s.name}.json": build(s) for s in DASHBOARDS}
    for name, board in expected.items():
        path = out / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif json.loads(path.read_text()) != board:
            problems.append(f"{path}: differs from hloserve.observability.dashboards")
    for path in sorted(out.glob("hloserve-*.json")):
        if path.name not in expected:
            problems.append(f"{path}: no dashboard of that name")
    return problems


def panels_of(name: str) -> Sequence[PanelSpec]:
    """The panels of dashboard ``name``."""
    return next(d.panels for d in DASHBOARDS if d.name == name)
