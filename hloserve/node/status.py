"""``hloserve status URL``: a server's weight cache table from its Prometheus endpoint
(docs/on_demand_weights.md); ``--models ADMIN_URL``: the supervisor's ``/models`` table.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from hloserve import metric_names
from hloserve.errors import InvalidArgumentError, UnavailableError
from hloserve.prometheus_text import CacheStatus
from hloserve.units import format_bytes

#: Times :func:`fetch_models` asks when the supervisor answers 503 (1 s apart).
UNAVAILABLE_TRIES = 3


def fetch_models(url: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The ``/models`` rows of a supervisor's admin port; ``url`` is ``host:port`` or a URL;
    raises UnavailableError: the port cannot be reached, or the server behind it does not answer;
    InvalidArgumentError: something answers there, but not a ``/models`` page."""
    url = (url if "://" in url else f"http://{url}").rstrip("/")
    if not url.endswith("/models"):
        url += "/models"
    not_models = f"{url} is not the model list of hloserve serve's admin port (--admin-port)"
    for attempt in range(UNAVAILABLE_TRIES):
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                return list(json.loads(response.read().decode())["models"])
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                raise InvalidArgumentError(f"{not_models}: HTTP {exc.code} {exc.reason}") from None
            reason = exc.reason  # tritonserver did not answer the supervisor (busy a moment?)
        except (http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(f"{not_models}: {type(exc).__name__}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise UnavailableError(f"{url}: cannot read the model list: {exc}") from None
        if attempt + 1 < UNAVAILABLE_TRIES:
            time.sleep(1.0)
    raise UnavailableError(f"{url}: the server does not answer: {reason}")


def render_models(rows: list[dict[str, Any]]) -> str:
    """``/models`` rows as a text table: model, version, state, last reload (local time; ``-``:
    loaded at start), error (else Triton's reason for a model not READY)."""
    header = ("model", "version", "state", "last reload", "error")
    table = [header]
    for row in rows:
        when = row.get("last_reload")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "-"
        error = row.get("error") or (row.get("reason", "") if row.get("state") != "READY" else "")
        table.append(
            (
                str(row["name"]),
                str(row.get("version") or "-"),
                str(row.get("state") or "-"),
                stamp,
                " ".join(str(error).split()) or "-",  # one line per model
            )
        )
    return _table(table, left=len(header))


def print_quietly(text: str) -> None:
    """Print ``text``; a reader that went away (``| head``) ends it quietly (the Python
    ``signal`` module documentation's recipe)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


#: The device memory kinds ``hloserve status`` prints, in order (the scratch is the largest of
#: any loaded executable).
_DEVICE_KINDS = tuple(k for k in metric_names.DEVICE_MEMORY_KINDS if k != "budget")


def render_status(status: CacheStatus) -> str:
    """The cache state as a text table, models by name."""
    budget = format_bytes(status.budget_bytes) if status.budget_bytes else "none (all resident)"
    lines = [f"weight cache: budget {budget}, resident {format_bytes(status.resident_bytes)}"]
    if status.device:  # absent on CPU
        shown = [
            (k.replace("_", " "), status.device[k]) for k in _DEVICE_KINDS if k in status.device
        ]
        lines.append("device memory: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in shown))
    header = ("model", "residency", "weights", "resident", "loads", "evictions", "mean load")
    rows = [header]
    for name in sorted(status.models):
        m = status.models[name]
        mean = f"{m.load_seconds / m.loads * 1e3:.2f} ms" if m.loads else "-"
        rows.append(
            (
                name,
                m.residency or "-",
                format_bytes(m.nbytes) if m.nbytes is not None else "-",
                format_bytes(m.resident_bytes) if m.resident_bytes else "-",
                f"{m.loads:.0f}",
                f"{m.evictions:.0f}",
                mean,
            )
        )
    return "\n".join([*lines, _table(rows, left=2)])


def _table(rows: Sequence[Sequence[str]], left: int) -> str:
    """``rows`` in aligned columns, the first ``left`` flush left, the others right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    )
