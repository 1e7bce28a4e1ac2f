"""hloserve's Grafana dashboards, built with Grafana's ``grafana-foundation-sdk``.

The panels are data, in ``dashboards.yaml`` next to this module (docs/observability.md says what
each dashboard answers). ``python -m hloserve.observability dashboards --out DIR`` writes the JSON
(checked in under ``containers/grafana/dashboards``; ``--check`` fails when it drifts).

Template variables: ``$node`` (the ``node`` label the target files set), ``$worker`` (the
``worker`` label), ``$model`` (Triton's ``model`` label). All are multi-value with "All".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: Dashboard uids are ``hloserve-<name>``; the tag groups them in Grafana.
TAG = "hloserve"
#: The provisioned Prometheus data source's uid (containers/grafana/provisioning).
DATASOURCE_UID = "hloserve-prometheus"


@dataclass(frozen=True)
class PanelSpec:
    """One panel: PromQL ``exprs`` with one Grafana ``legends`` format each, a Grafana ``unit``
    id, ``kind`` ``timeseries``, ``stat`` or ``table``, and hover text ``description``."""

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


def _tuples(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}


def _load() -> tuple[DashboardSpec, ...]:
    data = yaml.safe_load((Path(__file__).parent / "dashboards.yaml").read_text())
    return tuple(
        DashboardSpec(
            name, **_tuples({**d, "panels": [PanelSpec(**_tuples(p)) for p in d["panels"]]})
        )
        for name, d in data.items()
    )


#: Every dashboard, from ``dashboards.yaml``.
DASHBOARDS: tuple[DashboardSpec, ...] = _load()

_VARIABLE_QUERIES = {
    "node": "label_values(up, node)",
    "worker": 'label_values(up{job="hloserve-worker"}, worker)',
    "model": "label_values(nv_inference_request_success, model)",
}


def expand(expr: str, values: Mapping[str, str] | None = None) -> str:
    """``expr`` with ``$var`` replaced by a regex value (default ``.*``, Grafana's "All")."""
    values = values or {}
    return re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), ".*"), expr)


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
    kinds: dict[str, Any] = dict(timeseries=timeseries.Panel, stat=stat.Panel, table=table.Panel)
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
