"""The Python steps of scripts/gpu_check.sh (docs/gpu_check.md): ``env``, ``memory``, ``summary``.

    python scripts/gpu_check.py env --wheels gpu-wheels --site DIR --json OUT/env.json
    python scripts/gpu_check.py memory --json OUT/memory.json [--mib 256]
    python scripts/gpu_check.py summary OUT

``env`` installs every wheel of ``--wheels`` into ``--site`` (``pip install --no-index
--no-deps --target``; unpacked with :mod:`zipfile` where the interpreter has no pip), a folder
that gpu_check.sh puts first on ``PYTHONPATH``, so the check runs on the wheels' versions (one
resolved set: pydantic-core matches pydantic) whatever the device has; NumPy, JAX and ml_dtypes
stay the device's. Then it imports hloserve's core in a fresh interpreter and records the
interpreter, the versions, JAX's devices and ``nvidia-smi``'s view.

``memory`` (issue 26) starts two runtime-like processes at once, each setting JAX's allocator as
the runtime does (:func:`hloserve.triton_backend.runtime.device_memory.allocator_environment`) and
placing ``--mib`` of data: both must run, and neither may hold 75% of the card (JAX's
preallocating default, under which the second failed); then, in a fresh process, it compares
the scratch XLA's compiled memory analysis gives for an executable (``temp_size_in_bytes``, what
the runtime's budget reserves) with the peak its execution adds on the device.

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
    "hloserve.triton_backend.runtime.server",
    "hloserve.triton_backend.front.front_channel",
    "hloserve.triton_backend.runtime.weight_cache",
    "hloserve.triton_backend.runtime.executable_cache",
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


_RUNTIME_PROBE = """
import json, os, subprocess, sys, time
from hloserve.triton_backend.runtime.device_memory import allocator_environment
settings = allocator_environment()
import jax, jax.numpy as jnp
device = jax.devices()[0]
x = jax.device_put(jnp.ones((int(sys.argv[1]) << 18,), jnp.float32), device).block_until_ready()
stats = device.memory_stats() or {}
time.sleep(float(sys.argv[2]))  # both processes hold their memory at once
smi = None
try:
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=20).stdout
except (OSError, subprocess.SubprocessError):
    pass
used = [int(l.split(",")[1]) << 20 for l in (smi or "").splitlines()
        if l.split(",")[0].strip() == str(os.getpid())]
print(json.dumps({"settings": settings, "bytes_limit": stats.get("bytes_limit"),
                  "bytes_in_use": stats.get("bytes_in_use"),
                  "nvidia_smi_bytes": used[0] if used else None}))
"""

_SCRATCH_PROBE = """
import json
from hloserve.triton_backend.runtime.device_memory import allocator_environment, executable_memory
allocator_environment()
import jax, jax.numpy as jnp
device = jax.devices()[0]
n = 4096
def f(a):  # an (n, n) f32 intermediate (64 MiB) that is neither an argument nor the output
    s = jax.nn.softmax(a @ a.T, axis=-1)
    return (s @ a).sum(axis=0)
a = jax.device_put(jnp.ones((n, 256), jnp.float32) * 1e-3, device).block_until_ready()
compiled = jax.jit(f).lower(a).compile()
code, temp = executable_memory(compiled.runtime_executable())
stats = device.memory_stats() or {}
before, peak_before = stats.get("bytes_in_use"), stats.get("peak_bytes_in_use")
out = compiled(a).block_until_ready()
stats = device.memory_stats() or {}
peak = stats.get("peak_bytes_in_use")
added = None if peak is None or before is None else peak - max(before, peak_before or 0)
print(json.dumps({"temp_bytes": temp, "code_bytes": code, "peak_added_bytes": added,
                  "output_bytes": int(out.nbytes)}))
"""


def memory(args: argparse.Namespace) -> int:
    """Two runtimes on one card, and compile-time scratch against the measured peak."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RUNTIME_PROBE, str(args.mib), "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    runtimes = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        lines = out.strip().splitlines()
        runtimes.append(
            json.loads(lines[-1]) if proc.returncode == 0 and lines else {"error": err[-2000:]}
        )
    scratch_run = subprocess.run(
        [sys.executable, "-c", _SCRATCH_PROBE], capture_output=True, text=True, env=env, timeout=180
    )
    lines = scratch_run.stdout.strip().splitlines()
    scratch = json.loads(lines[-1]) if scratch_run.returncode == 0 and lines else None
    result: dict[str, Any] = {
        "runtimes": runtimes,
        "both_ran": all("error" not in r for r in runtimes),
        "scratch": scratch or {"error": scratch_run.stderr[-2000:]},
    }
    print(json.dumps(result, indent=2))
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["both_ran"] else 1


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
    mem = _load(out / "memory.json")
    if mem is not None:
        # each would hold 75% of the card under JAX's preallocating default; the card is the
        # allocator's limit over the runtime's default fraction (0.9)
        held = [r.get("nvidia_smi_bytes") or r.get("bytes_in_use") for r in mem["runtimes"]]
        cards = [(r.get("bytes_limit") or 0) / 0.9 for r in mem["runtimes"]]
        under: bool | None = mem["both_ran"] and all(
            h is not None and h < 0.25 * card for h, card in zip(held, cards, strict=True)
        )
        if not on_gpu:
            under = None if mem["both_ran"] else False
        checks["two_runtimes_on_one_card"] = _check(
            [_mib(h) for h in held],
            "both run, each holding what it placed (MiB), under 25% of the card (issue 26)",
            under,
        )
        sc = mem["scratch"]
        if "temp_bytes" in sc and sc.get("peak_added_bytes"):
            checks["scratch_figure_vs_peak"] = _check(
                round(sc["temp_bytes"] / sc["peak_added_bytes"], 3),
                "reported: XLA temp bytes / peak added by one execution (issue 26)",
                None,
            )
        summary["memory"] = mem
    if wc is not None and wc.get("pinned_gb_s"):
        gbs = wc["cache_gb_s"] / wc["pinned_gb_s"]
        checks["cold_load_gb_s_vs_pinned_put"] = _check(
            round(gbs, 3),
            ">= 0.8x (issue 26)",
            gbs >= 0.8 if wc["host_tier"] == "pinned_host" else None,
        )
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
    p = sub.add_parser("memory", help="two runtimes on one card; scratch figure vs peak")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--mib", type=int, default=256, help="MiB each runtime places")
    p.set_defaults(run=memory)
    p = sub.add_parser("summary", help="write OUT/summary.json")
    p.add_argument("out", type=Path)
    p.set_defaults(run=summary)
    args = parser.parse_args()
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
