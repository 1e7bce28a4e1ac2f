"""Render the weight cache panels of docs/observability.md from a benchmark's timeline.

    .venv/bin/python benchmarks/weight_cache.py --timeline weight_cache.json
    .venv/bin/python benchmarks/plot_weight_cache.py weight_cache.json \\
        -o docs/images/weight_cache.png

The input is what ``benchmarks/weight_cache.py --timeline`` writes: the settings, and per run
(a budget a third of the working set; every model resident) its results and the samples of its
tritonserver's metrics endpoint. The picture draws three panels of the weight cache dashboard
(containers/grafana/dashboards), computed the way their PromQL does from the same series:

- resident bytes per model, stacked, against the budget (``hloserve_weight_resident_bytes``,
  ``hloserve_weight_cache_budget_bytes``);
- loads and evictions per second (``rate()`` of ``hloserve_weight_loads_total`` and
  ``hloserve_weight_evictions_total`` over ``--window-s``);
- hit ratio: one minus loads per execution over the same window (``hloserve_executions_total``),
  for both runs, at the moments the runtime publishes its executions (once a second).

Needs matplotlib (the ``plots`` extra: ``pip install -e .[plots]``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIB = 2**20


def rate(samples: Sequence[dict[str, Any]], name: str, window_s: float) -> list[float]:
    """Per-second increase of counter ``name`` over the trailing ``window_s`` at each sample
    (Prometheus' ``rate()`` without extrapolation); 0 at the first sample."""
    out = []
    for i, now in enumerate(samples):
        j = i
        while j > 0 and now["t"] - samples[j - 1]["t"] <= window_s:
            j -= 1
        dt = now["t"] - samples[j]["t"]
        out.append((now[name] - samples[j][name]) / dt if dt > 0 else 0.0)
    return out


def hit_ratio(
    samples: Sequence[dict[str, Any]], window_s: float
) -> tuple[list[float], list[float]]:
    """``(t, 1 - rate(loads) / rate(executions))`` at the samples where the executions counter
    moved. The runtime publishes executions once a second while loads count at once, so only
    those samples see both counters at the same moment (elsewhere the ratio swings by the
    second's executions)."""
    moved = [
        s
        for i, s in enumerate(samples)
        if i == 0 or s["hloserve_executions_total"] != samples[i - 1]["hloserve_executions_total"]
    ]
    loads = rate(moved, "hloserve_weight_loads_total", window_s)
    runs = rate(moved, "hloserve_executions_total", window_s)
    points = [(s["t"], 1.0 - lo / ex) for s, lo, ex in zip(moved, loads, runs, strict=True) if ex]
    return [t for t, _ in points], [max(0.0, r) for _, r in points]


def render(data: dict[str, Any], out: Path, window_s: float) -> None:
    """Write the three panels of ``data`` (benchmarks/weight_cache.py's timeline) to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = data["settings"]
    (label_a, run_a), (label_b, run_b) = data["runs"].items()
    samples = run_a["timeline"]
    t = [s["t"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8.6), sharex=True, constrained_layout=True)
    fig.suptitle(
        f"weight cache: {settings['models']} models x {settings['weight_mib']:g} MiB = "
        f"{data['total_mib']:.0f} MiB of weights, budget 1/{settings['over']:g} of it, "
        f"{settings['clients']} clients",
        fontsize=11,
    )

    resident = axes[0]
    models = sorted({m for s in samples for m in s["hloserve_weight_resident_bytes"]})
    stacks = [
        [s["hloserve_weight_resident_bytes"].get(m, 0.0) / MIB for s in samples] for m in models
    ]
    resident.stackplot(t, stacks, labels=models, step="post", alpha=0.85)
    budget = [s["hloserve_weight_cache_budget_bytes"] / MIB for s in samples]
    resident.plot(t, budget, color="black", linestyle="--", linewidth=1.4, label="budget")
    resident.axhline(data["total_mib"], color="grey", linestyle=":", label="all weights")
    resident.set_ylabel("MiB on the device")
    resident.set_title(f"resident bytes per model vs budget: {label_a}", fontsize=10, loc="left")
    resident.legend(loc="upper left", ncol=len(models) + 2, fontsize=8, frameon=False)
    resident.set_ylim(0, data["total_mib"] * 1.25)

    churn = axes[1]
    for name, text in (
        ("hloserve_weight_loads_total", "loads/s"),
        ("hloserve_weight_evictions_total", "evictions/s"),
    ):
        churn.plot(t, rate(samples, name, window_s), label=text)
    churn.set_ylabel("per second")
    churn.set_title(
        f"loads and evictions (rate over {window_s:g} s): mean {run_a['loads/s']:.1f} loads/s",
        fontsize=10,
        loc="left",
    )
    churn.legend(loc="upper right", fontsize=8, frameon=False)

    hits = axes[2]
    for label, run in ((label_a, run_a), (label_b, run_b)):
        times, ratio = hit_ratio(run["timeline"], window_s)
        hits.plot(
            times,
            ratio,
            marker=".",
            label=f"{label}: {run['requests/s']:.0f} req/s, p50 {run['p50 ms']:.1f} ms, "
            f"p99 {run['p99 ms']:.1f} ms",
        )
    hits.set_ylim(0, 1.05)
    hits.set_ylabel("hit ratio")
    hits.set_xlabel("seconds into the request mix")
    hits.set_title("executions that found their weights resident", fontsize=10, loc="left")
    hits.legend(loc="center right", fontsize=8, frameon=False)
    for ax in axes:
        ax.grid(alpha=0.3)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path, help="benchmarks/weight_cache.py --timeline output")
    parser.add_argument("-o", "--out", type=Path, default=Path("docs/images/weight_cache.png"))
    parser.add_argument("--window-s", type=float, default=4.0, help="rate window (4)")
    args = parser.parse_args(argv)
    render(json.loads(args.timeline.read_text()), args.out, args.window_s)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
