"""Several models over the channel on one device: device memory and RSS per extra model.

    python benchmarks/device_models.py [--models 3] [--json PATH]

The runtime core (:class:`RuntimeServer` over :class:`RuntimeModel`, weights resident on the
device) and ``--models`` front instances (:class:`ChannelFront`), all in this process over the
real channel (abstract Unix socket, /dev/shm arenas), as tests/test_channel.py runs them; no
Triton. The models are copies of the digits CNN with untrained weights of distinct seeds
(``digits0``, ``digits1``, ...: distinct contents, so distinct bundles the runtime compiles and
holds one by one; no scikit-learn needed). Measures, in order:

1. device bytes in use (``Device.memory_stats()["bytes_in_use"]``; None on CPU, which keeps
   no statistics) and this process's RSS and PSS (``/proc/self/smaps_rollup``) before the
   runtime, after it starts, and after each model's hello/load (the runtime compiles its
   executables, batch sizes 1, 8 and 32, and places its weights) and its first request;
2. per extra model (the second model on): the mean growth of each, and the load seconds;
3. one request (batch 1) through each model, checked against the same function run by JAX on
   the host CPU (relative tolerance 1e-2: a GPU may run f32 convolutions in TF32); no two
   models' expected answers agree within it, so the check tells them apart;
4. after every front has closed (the runtime releases each bundle): device bytes in use again,
   which should be back near the level after the runtime started.

Issue 11's GPU check ("the runtime core with two models over the channel on the device;
report device memory per extra model") is ``--models 2`` or more; docs/gpu_check.md. Exit
status 1 when an answer is wrong or missing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Relative tolerance of the answer check (TF32 convolutions on a GPU keep ~3 decimal digits).
RTOL = 1e-2


def in_use(device: Any) -> int | None:
    """Device bytes in use, or None where the backend keeps no statistics (CPU)."""
    stats = device.memory_stats()
    return None if not stats else int(stats.get("bytes_in_use", 0))


def host_memory() -> dict[str, int | None]:
    """This process's ``rss`` and ``pss`` in bytes (None where ``/proc`` does not say)."""
    found: dict[str, int | None] = {"rss": None, "pss": None}
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            found[key.lower()] = int(rest.split()[0]) * 1024
    return found


def close_enough(got: np.ndarray, want: np.ndarray, rtol: float = RTOL) -> bool:
    """``got`` within ``rtol`` of ``want``, relative to the largest magnitude in ``want``."""
    scale = float(np.max(np.abs(want))) or 1.0
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=rtol * scale))


class Answers:
    """Collects ``respond`` calls; :meth:`wait` blocks until one arrived for a handle."""

    def __init__(self) -> None:
        self.results: dict[Any, Any] = {}
        self._cond = threading.Condition()

    def __call__(self, handle: Any, result: Any) -> None:
        with self._cond:
            self.results[handle] = result
            self._cond.notify_all()

    def wait(self, handle: Any, timeout: float = 60.0) -> Any:
        with self._cond:
            if not self._cond.wait_for(lambda: handle in self.results, timeout):
                raise TimeoutError(f"no answer for {handle!r} in {timeout} s")
            return self.results.pop(handle)


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def _mean(values: Sequence[int | float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:+.1f} MiB"


def run(models: int, scratch: Path) -> dict[str, Any]:
    """Measure ``models`` digits copies over the channel; return the results (see module)."""
    import jax

    sys.path.insert(0, str(ROOT / "examples" / "digits"))
    import digits_model
    import export as digits_export

    from hloserve.bundle.bundle import load_bundle
    from hloserve.triton_backend.front.core import FrontModel
    from hloserve.triton_backend.front.front_channel import ChannelFront, Request
    from hloserve.triton_backend.runtime.core import RuntimeModel
    from hloserve.triton_backend.runtime.scheduler import SchedulerConfig
    from hloserve.triton_backend.runtime.server import RuntimeServer

    device = jax.devices()[0]
    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS without cpu: the reference runs on the device
        cpu = device
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 1)).astype(np.float32)
    bundles, expected = [], []
    for i in range(models):
        bundles.append(digits_export.export_digits(scratch, untrained_seed=i, name=f"digits{i}"))
        params = jax.device_put(digits_export.untrained_params(i), cpu)
        want = jax.jit(digits_model.apply)(params, jax.device_put(x, cpu))
        expected.append(np.asarray(want))
    distinct = all(
        not close_enough(a, b) for i, a in enumerate(expected) for b in expected[i + 1 :]
    )
    gc.collect()

    def snapshot(what: str) -> dict[str, Any]:
        sizes = {"device_bytes_in_use": in_use(device), **host_memory()}
        shown = {k: "n/a" if v is None else f"{v / 2**20:.1f} MiB" for k, v in sizes.items()}
        row = {"what": what, **sizes}
        print(
            f"{what:<34} device {shown['device_bytes_in_use']:>11}  RSS {shown['rss']:>11}  "
            f"PSS {shown['pss']:>11}",
            flush=True,
        )
        return row

    rows = [snapshot("before the runtime")]
    server = RuntimeServer(
        RuntimeModel(device=device),
        address=f"\0hloserve.device-models-{uuid.uuid4().hex}",
        scheduler_config=SchedulerConfig(discipline="fifo"),
    )
    server.start()
    rows.append(snapshot("runtime started"))
    answers = Answers()
    fronts: list[ChannelFront] = []
    per_model: list[dict[str, Any]] = []

    try:
        for i, path in enumerate(bundles):
            before = rows[-1]
            start = time.perf_counter()
            core = FrontModel(path.name, load_bundle(path))
            front = ChannelFront(core, path, answers, address=server.address, wait_s=60.0)
            front.start(wait_s=300.0)
            fronts.append(front)
            load_s = time.perf_counter() - start
            loaded = snapshot(f"{path.name} loaded ({load_s:.2f} s)")
            front.submit([Request(("first", i), {"image": x})])
            result = answers.wait(("first", i))
            answered = snapshot(f"{path.name} answered one request")
            rows += [loaded, answered]
            ok = not isinstance(result, Exception) and close_enough(
                np.asarray(result["logits"]), expected[i]
            )
            error = repr(result) if isinstance(result, Exception) else None
            per_model.append(
                {
                    "model": path.name,
                    "load_s": load_s,
                    "weight_bytes": load_bundle(path).weight_nbytes,
                    "device_bytes": _delta(
                        answered["device_bytes_in_use"], before["device_bytes_in_use"]
                    ),
                    "rss_bytes": _delta(answered["rss"], before["rss"]),
                    "pss_bytes": _delta(answered["pss"], before["pss"]),
                    "answer_ok": ok,
                    "error": error,
                }
            )
            print(f"  {path.name}: answer {'matches' if ok else 'DIFFERS'}", flush=True)
    finally:
        for front in fronts:
            front.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server.core.bundle_names:
            time.sleep(0.05)  # the runtime releases a bundle when its front's connection ends
        gc.collect()
        released = snapshot("every front closed")
        server.close()

    extra = per_model[1:]
    started = rows[1]["device_bytes_in_use"]
    after = released["device_bytes_in_use"]
    result = {
        "device": f"{device.device_kind} ({device.platform})",
        "jax": jax.__version__,
        "models": models,
        "snapshots": [*rows, released],
        "per_model": per_model,
        "first_model_device_bytes": per_model[0]["device_bytes"] if per_model else None,
        "per_extra_model": {
            "device_bytes": _mean([m["device_bytes"] for m in extra]),
            "rss_bytes": _mean([m["rss_bytes"] for m in extra]),
            "pss_bytes": _mean([m["pss_bytes"] for m in extra]),
            "load_s": _mean([m["load_s"] for m in extra]),
        },
        "device_bytes_back_after_release": _delta(after, started),
        "all_answers_ok": len(per_model) == models and all(m["answer_ok"] for m in per_model),
        # the check can tell the models apart: no two give the same answer
        "answers_distinct": distinct,
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=3, help="digits copies (3; at least 2)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="results as JSON")
    args = parser.parse_args(argv)
    if args.models < 2:
        parser.error("--models must be at least 2 (the per-extra-model figures need two)")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before JAX's client
    with tempfile.TemporaryDirectory(prefix="hloserve-device-models-") as tmp:
        result = run(args.models, Path(tmp))
    extra = result["per_extra_model"]
    print(f"\n{result['models']} digits models over the channel on {result['device']}")
    print(f"first model: device {_mib(result['first_model_device_bytes'])}")
    print(
        f"per extra model: device {_mib(extra['device_bytes'])}, RSS {_mib(extra['rss_bytes'])}"
        f", PSS {_mib(extra['pss_bytes'])}, load {extra['load_s']:.2f} s"
    )
    print(
        "device bytes after every front closed, vs the runtime started: "
        f"{_mib(result['device_bytes_back_after_release'])}"
    )
    print(
        "answers: "
        + ("all match" if result["all_answers_ok"] else "SOME DIFFER OR FAILED")
        + ("" if result["answers_distinct"] else " (BUT two models answer alike)")
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["all_answers_ok"] and result["answers_distinct"] else 1


if __name__ == "__main__":
    sys.exit(main())
