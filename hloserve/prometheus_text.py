"""Prometheus text as tritonserver's metrics endpoint writes it: fetched, parsed, and the
runtime's weight cache state read from it (``hloserve status``, the gateway's lpt_packing).
Series: docs/on_demand_weights.md, "Metrics"; :mod:`hloserve.metric_names`.
"""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from hloserve import metric_names
from hloserve.errors import InvalidArgumentError, UnavailableError

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class ModelCacheRow:
    """One model's row. Bytes in bytes, seconds in seconds; None = not reported."""

    name: str
    nbytes: float | None = None
    residency: str = ""
    resident_bytes: float = 0.0
    loads: float = 0.0
    evictions: float = 0.0
    load_seconds: float = 0.0


@dataclass
class CacheStatus:
    """The cache of one runtime: budget (0 = none), resident total, rows by model name, and its
    device memory by kind (``hloserve_device_memory_bytes``; empty on CPU)."""

    budget_bytes: float = 0.0
    resident_bytes: float = 0.0
    models: dict[str, ModelCacheRow] = field(default_factory=dict)
    device: dict[str, float] = field(default_factory=dict)


#: Per-model series -> the :class:`ModelCacheRow` field they set.
_ROW_FIELDS = {
    metric_names.WEIGHT_RESIDENT_BYTES: "resident_bytes",
    metric_names.WEIGHT_LOADS: "loads",
    metric_names.WEIGHT_EVICTIONS: "evictions",
    metric_names.WEIGHT_LOAD_SECONDS + "_sum": "load_seconds",
}


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample line of Prometheus text."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if line.startswith("#") or match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        parsed = {
            k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(labels or "")
        }
        samples.append((name, parsed, number))
    return samples


def cache_status(text: str) -> CacheStatus:
    """The weight cache state in a tritonserver's metrics text; InvalidArgumentError when it
    holds no hloserve weight cache series."""
    status = CacheStatus()
    seen = False
    for name, labels, value in parse_samples(text):
        if name == metric_names.DEVICE_MEMORY_BYTES and "kind" in labels:
            status.device[labels["kind"]] = value
            continue
        if not name.startswith(metric_names.WEIGHT_PREFIX):
            continue
        seen = True
        if name == metric_names.WEIGHT_CACHE_BUDGET_BYTES:
            status.budget_bytes = value
            continue
        if name == metric_names.WEIGHT_CACHE_RESIDENT_BYTES:
            status.resident_bytes = value
            continue
        model = labels.get("model")
        if model is None:
            continue
        row = status.models.setdefault(model, ModelCacheRow(model))
        if name == metric_names.WEIGHT_BYTES:
            row.nbytes, row.residency = value, labels.get("residency", "")
        elif name in _ROW_FIELDS:
            setattr(row, _ROW_FIELDS[name], value)
    if not seen:
        raise InvalidArgumentError(
            "no hloserve_weight_* series: is this the metrics endpoint (:8002) of a tritonserver "
            "serving an hloserve repository?"
        )
    return status


def fetch_metrics(url: str, timeout_s: float = 10.0) -> str:
    """The text of a metrics endpoint; ``url`` is ``host:port`` or a full ``http://`` URL; raises
    UnavailableError: the endpoint cannot be reached; InvalidArgumentError: something answers there,
    but not like a metrics endpoint."""
    if "://" not in url:
        url = f"http://{url}"
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    not_metrics = f"{url} does not answer like Triton's metrics endpoint (--metrics-port, 8002)"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:  # an HTTP server, but not that endpoint (404, 400)
        raise InvalidArgumentError(f"{not_metrics}: HTTP {exc.code} {exc.reason}") from None
    except (http.client.HTTPException, UnicodeDecodeError) as exc:  # e.g. a gRPC port
        raise InvalidArgumentError(f"{not_metrics}: {type(exc).__name__}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise UnavailableError(f"{url}: cannot read metrics: {exc}") from None
