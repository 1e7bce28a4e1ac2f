"""The two Python steps of scripts/gpu_check.sh (docs/gpu_check.md): ``env`` and ``summary``.

    python scripts/gpu_check.py env --wheels gpu-wheels --site DIR --json OUT/env.json
    python scripts/gpu_check.py summary OUT

``env`` installs every wheel of ``--wheels`` into ``--site`` (``pip install --no-index
--no-deps --target``; unpacked with :mod:`zipfile` where the interpreter has no pip), a folder
that gpu_check.sh puts first on ``PYTHONPATH``, so the check runs on the wheels' versions (one
resolved set: pydantic-core matches pydantic) whatever the device has; NumPy, JAX and ml_dtypes
stay the device's. Then it imports hloserve's core in a fresh interpreter and records the
interpreter, the versions, JAX's devices and ``nvidia-smi``'s view.

``summary`` merges ``steps.tsv`` and each step's JSON under OUT into ``OUT/summary.json``, with
the figures the issues ask for and their targets (docs/gpu_check.md, "The summary").
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

#: What the check imports: the runtime core, the channel, the exporter, both caches.
CORE_MODULES = (
    "hloserve.bundle",
    "hloserve.export",
    "hloserve.triton_backend.runtime_server",
    "hloserve.triton_backend.front_channel",
    "hloserve.triton_backend.weight_cache",
    "hloserve.triton_backend.executable_cache",
)
#: Distributions whose version and origin the env report gives.
REPORTED = ("numpy", "jax", "jaxlib", "ml_dtypes", "pydantic", "pydantic_core", "yaml")
REPORTED += ("safetensors", "rich", "flatbuffers")

_PROBE = """
import importlib, json, sys
from importlib import metadata
DISTS = {"yaml": "PyYAML"}
out = {"python": sys.version, "executable": sys.executable, "imports": {}, "modules": {}}
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
        out["imports"][name] = "ok"
    except Exception as exc:
        out["imports"][name] = f"{type(exc).__name__}: {exc}"
for name in sys.argv[2].split(","):
    try:
        module = importlib.import_module(name)
        try:
            version = metadata.version(DISTS.get(name, name))
        except metadata.PackageNotFoundError:
            version = getattr(module, "__version__", None)
        out["modules"][name] = {"version": version, "file": getattr(module, "__file__", None)}
    except Exception as exc:
        out["modules"][name] = {"error": f"{type(exc).__name__}: {exc}"}
try:
    import jax
    devices = jax.devices()
    out["devices"] = [f"{d.device_kind} ({d.platform})" for d in devices]
    stats = devices[0].memory_stats()
    out["memory_stats"] = {k: stats[k] for k in ("bytes_in_use", "bytes_limit") if k in stats} \
        if stats else None
except Exception as exc:
    out["devices"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def install(wheels: Path, site: Path) -> dict[str, Any]:
    """Install every ``*.whl`` of ``wheels`` into ``site``; what was done, and how."""
    files = sorted(wheels.glob("*.whl"))
    site.mkdir(parents=True, exist_ok=True)
    if not files:
        return {"wheels": [], "how": f"none: no wheels in {wheels}"}
    if importlib.util.find_spec("pip") is not None:
        argv = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        argv += ["--no-index", "--no-deps", "--target", str(site), *map(str, files)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return {"wheels": [f.name for f in files], "how": "pip --target"}
        print(done.stdout + done.stderr, file=sys.stderr)
    for f in files:  # a wheel is a zip of what goes into site-packages
        with zipfile.ZipFile(f) as z:
            z.extractall(site)
    return {"wheels": [f.name for f in files], "how": "unzipped"}


def nvidia_smi() -> str | None:
    """``nvidia-smi``'s GPU list and memory, or None without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = "--query-gpu=name,driver_version,memory.total,memory.used"
    done = subprocess.run([exe, query, "--format=csv"], capture_output=True, text=True, timeout=30)
    return (done.stdout + done.stderr).strip()


def env(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {"platform": platform.platform(), "cpus": os.cpu_count()}
    # the channel's arenas live in /dev/shm (a container's default is 64 MiB)
    shm = Path("/dev/shm")
    report["dev_shm_bytes"] = shutil.disk_usage(shm).total if shm.is_dir() else None
    report["install"] = install(args.wheels, args.site)
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(CORE_MODULES), ",".join(REPORTED)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        print(probe.stdout + probe.stderr, file=sys.stderr)
        report["probe"] = {"error": probe.stderr[-2000:]}
    else:
        report["probe"] = json.loads(probe.stdout.strip().splitlines()[-1])
    report["nvidia_smi"] = nvidia_smi()
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    imports = report["probe"].get("imports", {})
    failed = [m for m in CORE_MODULES if imports.get(m) != "ok"]
    if failed:
        print(f"error: hloserve's core does not import here: {failed}", file=sys.stderr)
        return 1
    return 0


def _load(path: Path) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / 2**20, 2)


def _check(value: float | None, target: str, met: bool | None) -> dict[str, Any]:
    return {"value": value, "target": target, "met": met}


def summarize(out: Path) -> dict[str, Any]:
    """The summary (docs/gpu_check.md, "The summary") of the steps' outputs under ``out``."""
    steps = {}
    with (out / "steps.tsv").open() as f:
        for name, rc, seconds, limit in csv.reader(f, delimiter="\t"):
            code: int | str = int(rc) if rc.isdigit() else rc  # or "skipped"
            steps[name] = {"rc": code, "seconds": int(seconds), "limit_s": int(limit)}
    envr = _load(out / "env.json") or {}
    probe = envr.get("probe", {})
    devices = probe.get("devices")
    on_gpu = isinstance(devices, list) and any("(gpu)" in d or "(cuda)" in d for d in devices)
    summary: dict[str, Any] = {
        "on_gpu": on_gpu,
        "devices": devices,
        "python": probe.get("python"),
        "versions": {k: v.get("version") for k, v in probe.get("modules", {}).items()},
        "nvidia_smi": envr.get("nvidia_smi"),
        "steps": steps,
    }
    checks: dict[str, Any] = {}
    wc = _load(out / "weight_cache.json")
    if wc is not None:
        ratio = wc["ratio_cache_to_pinned"]
        pinned = wc["host_tier"] == "pinned_host"
        checks["cold_load_gb_s"] = _check(
            round(wc["cache_gb_s"], 2),
            "reported (issue 11); a bare pinned device_put of 1 GiB: 45-48 GB/s on an H200",
            None,
        )
        checks["cold_load_vs_pinned_put"] = _check(
            round(ratio, 3), "<= 1.2 (docs/on_demand_weights.md)", ratio <= 1.2 if pinned else None
        )
        checks["memory_back_after_eviction"] = _check(
            wc["memory_back_after_eviction"], "true", wc["memory_back_after_eviction"]
        )
        summary["weight_cache"] = wc
    packed = _load(out / "weight_cache_packed.json")
    if packed is not None:
        what = f"{packed['tensors']} arrays packed in {_mib(packed['packed_chunk_bytes'])} MiB"
        checks["packed_cold_load_gb_s"] = _check(
            round(packed["cache_gb_s"], 2), f"reported: {what} chunks", None
        )
        summary["weight_cache_packed"] = packed
    dm = _load(out / "device_models.json")
    if dm is not None:
        extra = dm["per_extra_model"]
        rss = extra["rss_bytes"]
        checks["device_mib_per_extra_model"] = _check(
            _mib(extra["device_bytes"]), "reported (issue 11)", None
        )
        checks["rss_mib_per_extra_model"] = _check(
            _mib(rss),
            "reported; runtime and fronts in one process here (issue 11's <= 50 MiB is per "
            "front model in Triton)",
            None,
        )
        right = bool(dm["all_answers_ok"] and dm["answers_distinct"])
        checks["models_answer_right"] = _check(right, "true", right)
        summary["device_models"] = dm
    xc = _load(out / "executable_cache.json")
    if xc is not None:
        goal = 100 if on_gpu else 25
        for bundle, ratio in xc["ratio_min"].items():
            checks[f"compile_over_load_{bundle}_min"] = _check(
                round(ratio, 1),
                f">= {goal}x per executable (issue 13, {'GPU' if on_gpu else 'CPU'})",
                ratio >= goal,
            )
        summary["executable_cache"] = xc
    ch = _load(out / "channel_roundtrip.json")
    if ch is not None:
        checks["channel_overhead_p50_us"] = _check(
            round(ch["overhead_p50_us"], 1), "reported: request p50 - execution p50", None
        )
        summary["channel_roundtrip"] = ch
    summary["checks"] = checks
    missed = [k for k, c in checks.items() if c["met"] is False]
    failed = [k for k, s in steps.items() if s["rc"] != 0]
    summary["verdict"] = {"missed": missed, "failed_steps": failed, "ok": not (missed or failed)}
    return summary


def summary(args: argparse.Namespace) -> int:
    result = summarize(args.out)
    (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("devices", "steps", "checks", "verdict")}, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("env", help="install the wheels, report the environment")
    p.add_argument("--wheels", type=Path, required=True)
    p.add_argument("--site", type=Path, required=True)
    p.add_argument("--json", type=Path, required=True)
    p.set_defaults(run=env)
    p = sub.add_parser("summary", help="write OUT/summary.json")
    p.add_argument("out", type=Path)
    p.set_defaults(run=summary)
    args = parser.parse_args()
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
