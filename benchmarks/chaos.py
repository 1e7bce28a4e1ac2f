"""Chaos on real servers: overload and kills, directly and through the gateway (issue 28).

    .venv/bin/python benchmarks/chaos.py [--overload-seconds 60] [--kills front,runtime,...]
        [--soak-seconds 1800 --reload-seconds 60]

One ``hloserve serve`` (one worker under the node supervisor: a dead stub is reloaded, a dead
tritonserver restarted) serves ``slow``: the golden ``affine`` bundle with a ``preprocess``
hook sleeping ``--hook-ms`` per call, the default front instances (two), Triton's queue bounded to
``--max-queue-size`` requests; beside it ``watched``, the same bundle with no sleep, which the
soak rewrites. A gateway (this process, HAProxy) stands in front of it. Every
case runs against both targets, ``direct`` (the worker's gRPC port) and ``gateway``.

**Overload**, per target: the saturation throughput of ``--clients`` closed-loop clients (as
many as the queue and the two instances hold, so none is refused) over
``--measure-seconds`` and the p50 of one client alone (baseline); then ``--factor`` (3) times
the saturation rate offered open-loop for ``--overload-seconds``. Checked: every accepted
request answered correctly, every refused one Triton's queue-full status (UNAVAILABLE
"Exceeds maximum queue size"), the server's RSS (tritonserver and its stubs) within
``--rss-slack-mib`` (200) of the baseline, and the p50 of one client over the 5 s after back
within 1.2x of the baseline.

**Kills**, each once under load (one closed-loop client per target): the front stubs, the
runtime stub, the tritonserver, the gateway's HAProxy master (``haproxy``: the gateway starts
it again, docs/gateway.md), SIGKILLed. Checked: no request hangs (every one answered within
``--hang-seconds``), failures carry the statuses docs/serving.md lists (UNAVAILABLE, INTERNAL),
recovery (a request answered on both targets) within ``--recovery-seconds``, and every request
sent after recovery succeeds.

**Two replicas** (``--kills replicas``): two ``hloserve serve`` processes, one worker each, and
the gateway routing ``slow`` to both (round robin); two closed-loop clients through the gateway,
and the first worker's tritonserver SIGKILLed. Checked: every request sent after the kill
answered, correctly (HAProxy re-sends a request whose connection could not be made to the other
replica: ``retry-on conn-failure``, ``option redispatch``, hloserve/gateway/dataplane.py); those
in flight at the kill answered or UNAVAILABLE; the killed worker serving again.

**Soak** (``--soak-seconds``, 0 = off): serve runs with ``--watch`` (``--watch-interval``),
three closed-loop clients through the gateway (two on ``slow``, one on ``watched``) while
``watched``'s hook file is rewritten every ``--reload-seconds`` (each a reload of a new version).
Checked: zero failed requests, every rewrite reloaded, the RSS growth from minute 5 (the first
sample in a shorter soak) to the end under 5%.

Counts by status are printed per case; exit status 1 when a check fails. On the 2-core shared
development machine the figures are noisy: read the checks and the ratios.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hloserve import names

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "affine"
MIB = 1024 * 1024
#: The queue-full text Triton answers (tritonserver 2.51, docs/serving.md).
QUEUE_FULL = "Exceeds maximum queue size"
#: Statuses a request in flight at a kill may get (docs/serving.md, docs/gateway.md).
KILL_STATUSES = ("StatusCode.UNAVAILABLE", "StatusCode.INTERNAL")
MODEL = "slow"
#: The bundle the soak rewrites while ``--watch`` follows the bundles directory.
WATCHED = "watched"


@dataclass(frozen=True)
class Outcome:
    """One request: its target, when it started and how long it took (s), its status ("OK" or
    tritonclient's ``status()``), its message, and whether an OK answer was correct."""

    target: str
    started: float
    seconds: float
    status: str
    message: str = ""
    correct: bool = True


@dataclass
class Case:
    """One case's outcomes and checks (name -> passed), with figures to print."""

    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    figures: dict[str, str] = field(default_factory=dict)

    def counts(self) -> Counter[str]:
        """Requests by status; a refusal for a full queue is counted as ``queue full``."""
        return Counter("queue full" if QUEUE_FULL in o.message else o.status for o in self.outcomes)

    @property
    def passed(self) -> bool:
        """Whether every check passed."""
        return all(self.checks.values())

    def lines(self) -> list[str]:
        """The case in words: counts, figures, checks."""
        out = [f"{self.name}: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts().items()))]
        out += [f"  {k}: {v}" for k, v in self.figures.items()]
        out += [f"  [{'ok' if v else 'FAILED'}] {k}" for k, v in self.checks.items()]
        return out


def make_slow(out: Path, hook_ms: float) -> Path:
    """``affine`` (``y = tanh(x @ w + b)``, f32 (n, 4) -> (n, 3)) with a sleeping hook."""
    import yaml

    shutil.copytree(GOLDEN, out)
    (out / "model.py").write_text(
        f"import time\n\n\ndef preprocess(inputs):\n    time.sleep({hook_ms / 1e3})\n"
        "    return inputs\n"
    )
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    manifest["format_version"] = 2
    (out / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return out


def expected_y(x: np.ndarray) -> np.ndarray:
    """What ``slow`` answers for ``x``."""
    from hloserve.bundle.bundle import load_bundle

    b, w = load_bundle(GOLDEN).load_weights()
    return np.asarray(np.tanh(x @ w + b), np.float32)


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def cmdline(pid: int) -> list[bytes]:
    """``pid``'s command line; [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


class Worker:
    """One ``hloserve serve`` process (one tritonserver under the node supervisor) on
    ``bundles``, its gRPC port ``direct``.

    Args:
        bundles: the bundles directory it serves.
        log: its log file.
        key: the model-control key it and the gateway share.
        max_queue_size: Triton's queue bound of ``slow``, requests.
        watch_s: with ``--watch``: seconds between two polls of ``bundles``; None: no watch.
    """

    def __init__(
        self, bundles: Path, log: Path, key: str, max_queue_size: int, watch_s: float | None
    ) -> None:
        from hloserve.model_control import ENV_KEY
        from hloserve.ports import free_ports

        http, grpc, metrics, admin = free_ports(4)
        self.direct = f"127.0.0.1:{grpc}"
        self.log = log
        command = [
            *(sys.executable, "-m", "hloserve.cli", "serve", str(bundles)),
            *("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)),
            *("--admin-port", str(admin)),
            *("--max-queue-size", f"{MODEL}={max_queue_size}"),
        ]
        if watch_s is not None:
            command += ["--watch", "--watch-interval", f"{watch_s:g}"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT), ENV_KEY: key},
                start_new_session=True,
            )

    def wait_ready(self, deadline: float) -> None:
        """Wait until serve logs that it is ready (``time.monotonic()`` ``deadline``)."""
        while "hloserve: ready after" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("serve did not get ready:\n" + self.tail())
            time.sleep(0.5)

    def tail(self, chars: int = 3000) -> str:
        """The end of serve's log."""
        return self.log.read_text(errors="replace")[-chars:]

    def tritonserver(self) -> int | None:
        """The pid of serve's tritonserver now (a restart makes a new one)."""
        for pid in children(self.proc.pid):
            argv = cmdline(pid)
            if argv and argv[0].endswith(b"tritonserver"):
                return pid
        return None

    def stubs(self, model: str) -> list[int]:
        """The live Python backend stubs of ``model``."""
        server = self.tritonserver()
        if server is None:
            return []
        found = []
        for pid in children(server):
            argv = cmdline(pid)
            stub = len(argv) > 1 and argv[0].endswith(b"triton_python_backend_stub")
            if stub and argv[1].endswith(f"/{model}/1/model.py".encode()):
                found.append(pid)
        return found

    def rss(self) -> int:
        """Bytes resident in tritonserver and its stubs (``/proc/<pid>/status`` VmRSS)."""
        server = self.tritonserver()
        total = 0
        for pid in [server, *children(server)] if server else []:
            try:
                text = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            match = re.search(r"VmRSS:\s+(\d+) kB", text)
            total += int(match.group(1)) * 1024 if match else 0
        return total

    def close(self) -> None:
        """Stop serve (SIGTERM; SIGKILL to its process group after 60 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


class Rig:
    """``workers`` ``hloserve serve`` processes on ``slow`` (and ``watched``, the bundle the
    soak rewrites) and a gateway in front of them (module docstring).

    Args:
        work: a scratch directory.
        hook_ms: the hook's sleep per call, ms.
        max_queue_size: Triton's queue bound of ``slow``, requests.
        workers: serve processes, each one worker; the gateway routes ``slow`` to every one
            (round robin), so 2 gives it two replicas.
        watch_s: serve with ``--watch`` polling every ``watch_s`` seconds; None: no watch.
    """

    def __init__(
        self,
        work: Path,
        hook_ms: float,
        max_queue_size: int,
        workers: int = 1,
        watch_s: float | None = None,
    ) -> None:
        from hloserve.model_control import ENV_KEY, new_key

        self.max_queue_size = max_queue_size
        self.bundles = work / "bundles"
        self.bundles.mkdir(parents=True)
        make_slow(self.bundles / MODEL, hook_ms)
        make_slow(self.bundles / WATCHED, 0.0)
        self.key = os.environ.get(ENV_KEY) or new_key()  # serve's workers and the gateway
        self.workers = [
            Worker(self.bundles, work / f"serve{i}.log", self.key, max_queue_size, watch_s)
            for i in range(workers)
        ]
        self.direct = self.workers[0].direct
        self.gateway: Any = None

    def start(self, timeout_s: float = 300.0) -> None:
        """Wait for every serve to be ready, then start the gateway in front of them."""
        from hloserve.gateway.config import GatewayConfig
        from hloserve.node.gateway_thread import GatewayThread

        deadline = time.monotonic() + timeout_s
        for w in self.workers:
            w.wait_ready(deadline)
        config = GatewayConfig.model_validate(
            {
                "workers": [w.direct for w in self.workers],
                "health": {"interval_seconds": 0.5, "failure_threshold": 1},
                "upstream": {"model_control_key": self.key},
            }
        )
        self.gateway = GatewayThread(
            config.model_copy(update={"listen": "127.0.0.1:0", "admin_port": 0})
        )
        self.targets = {"direct": self.direct, "gateway": f"127.0.0.1:{self.gateway.port}"}

    def tail(self, chars: int = 3000) -> str:
        """The end of every serve's log."""
        return "\n".join(w.tail(chars) for w in self.workers)

    def tritonserver(self) -> int | None:
        """The pid of the first worker's tritonserver now."""
        return self.workers[0].tritonserver()

    def stubs(self, model: str) -> list[int]:
        """The live Python backend stubs of ``model`` on the first worker."""
        return self.workers[0].stubs(model)

    def rss(self) -> int:
        """Bytes resident in every tritonserver and its stubs."""
        return sum(w.rss() for w in self.workers)

    def close(self) -> None:
        """Stop the gateway and every serve."""
        if self.gateway is not None:
            self.gateway.close()
        for w in self.workers:
            w.close()


@contextmanager
def rig(
    hook_ms: float = 20.0,
    max_queue_size: int = 4,
    workers: int = 1,
    watch_s: float | None = None,
) -> Iterator[Rig]:
    """A started :class:`Rig` in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="hloserve-chaos-") as work:
        r = Rig(Path(work), hook_ms, max_queue_size, workers, watch_s)
        try:
            r.start()
            yield r
        finally:
            r.close()


class Sender:
    """Sends requests of one row to ``model`` (``slow``, or ``watched``: the same answers) on
    one target and records each :class:`Outcome`."""

    def __init__(self, target: str, address: str, timeout_s: float, model: str = MODEL) -> None:
        import tritonclient.grpc as grpcclient

        self.target = target
        self.model = model
        self.client = grpcclient.InferenceServerClient(address)
        self.timeout_s = timeout_s
        self.x = np.arange(4, dtype=np.float32).reshape(1, 4) / 4
        self.y = expected_y(self.x)
        self.tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        self.tensor.set_data_from_numpy(self.x)

    def send(self) -> Outcome:
        """One request, answered or refused."""
        from tritonclient.utils import InferenceServerException

        start = time.monotonic()
        try:
            reply = self.client.infer(self.model, [self.tensor], client_timeout=self.timeout_s)
        except InferenceServerException as exc:
            return Outcome(
                self.target, start, time.monotonic() - start, str(exc.status()), exc.message()
            )
        y = reply.as_numpy("y")
        correct = y is not None and np.allclose(y, self.y, rtol=1e-5, atol=1e-6)
        return Outcome(self.target, start, time.monotonic() - start, "OK", "", bool(correct))

    def close(self) -> None:
        """Close the channel."""
        self.client.close()


def closed_loop(
    senders: list[Sender],
    seconds: float,
    stop: threading.Event | None = None,
    backoff_s: float = 0.05,
) -> list[Outcome]:
    """Each sender in a loop of its own until ``seconds`` pass (or ``stop`` is set), pausing
    ``backoff_s`` after a failed request."""
    outcomes: list[Outcome] = []
    end = time.monotonic() + seconds

    def loop(sender: Sender) -> None:
        for _ in range(1_000_000):
            if time.monotonic() >= end or (stop is not None and stop.is_set()):
                return
            outcomes.append(sender.send())
            if outcomes[-1].status != "OK":
                time.sleep(backoff_s)  # a client backs off after a failure (no busy loop)

    threads = [threading.Thread(target=loop, args=(s,), daemon=True) for s in senders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    return outcomes


def open_loop(make: Callable[[], Sender], rate: float, seconds: float) -> list[Outcome]:
    """``rate`` requests per second for ``seconds``, each on a pool thread of its own (at most
    48 outstanding, below the gateway's admission bound of 64)."""
    local = threading.local()

    def send() -> Outcome:
        if not hasattr(local, "sender"):
            local.sender = make()
        result: Outcome = local.sender.send()
        return result

    futures = []
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=48) as pool:
        for i in range(int(rate * seconds)):
            due = start + i / rate
            time.sleep(max(0.0, due - time.monotonic()))
            futures.append(pool.submit(send))
        return [f.result() for f in futures]


def p50(outcomes: list[Outcome]) -> float:
    """Median seconds of the answered requests (nan when none)."""
    ok = [o.seconds for o in outcomes if o.status == "OK"]
    return statistics.median(ok) if ok else float("nan")


def overload(
    r: Rig,
    target: str,
    seconds: float,
    measure_s: float = 5.0,
    clients: int | None = None,
    factor: float = 3.0,
    rss_slack_mib: float = 200.0,
) -> Case:
    """The overload case on ``target`` (module docstring)."""
    address = r.targets[target]
    # as many as the queue and the instances hold
    clients = clients or r.max_queue_size + names.DEFAULT_FRONT_INSTANCES
    case = Case(f"overload {target}")
    one = Sender(target, address, 30.0)
    closed_loop([one], 1.0)  # warm
    baseline = p50(closed_loop([one], measure_s))
    rss_before = r.rss()
    senders = [Sender(target, address, 30.0) for _ in range(clients)]
    saturated = closed_loop(senders, measure_s)
    rate = sum(o.status == "OK" for o in saturated) / measure_s
    for s in senders:
        s.close()
    offered = max(1.0, factor * rate)
    case.outcomes = open_loop(lambda: Sender(target, address, 30.0), offered, seconds)
    rss_after = r.rss()
    after = p50(closed_loop([one], 5.0))
    one.close()
    counts = case.counts()
    case.figures = {
        "saturation (closed loop)": f"{rate:.1f} req/s with {clients} clients",
        "offered": f"{offered:.1f} req/s for {seconds:g} s ({factor:g}x)",
        "accepted while overloaded": f"{counts['OK'] / seconds:.1f} req/s"
        f" ({counts['OK'] / seconds / max(rate, 1e-9):.2f}x saturation)",
        "p50 baseline / 5 s after": f"{baseline * 1e3:.1f} ms / {after * 1e3:.1f} ms"
        f" ({after / baseline:.2f}x)",
        "RSS before / after": f"{rss_before / MIB:.0f} / {rss_after / MIB:.0f} MiB",
    }
    case.checks = {
        "every accepted request answered correctly": all(
            o.correct for o in case.outcomes if o.status == "OK"
        )
        and counts["OK"] > 0,
        "every refused request: UNAVAILABLE 'Exceeds maximum queue size'": all(
            o.status == "OK" or (o.status == "StatusCode.UNAVAILABLE" and QUEUE_FULL in o.message)
            for o in case.outcomes
        ),
        "some requests refused (the queue bound is reached)": counts["queue full"] > 0,
        f"RSS within {rss_slack_mib:g} MiB of the baseline": rss_after - rss_before
        <= rss_slack_mib * MIB,
        "p50 back within 1.2x within 5 s": after <= 1.2 * baseline,
    }
    return case


def _kill(r: Rig, kind: str) -> int:
    """SIGKILL the process of ``kind`` (front: every front stub of the model, one per
    instance, so that it serves again only once reloaded; runtime, tritonserver, haproxy); the
    first pid."""
    if kind == "haproxy":  # the gateway runs in this process: HAProxy's master is its child
        pids = [p for p in children(os.getpid()) if (cmdline(p) or [b""])[0].endswith(b"haproxy")]
    elif kind == "tritonserver":
        pids = [p for p in [r.tritonserver()] if p is not None]
    else:
        pids = r.stubs(MODEL if kind == "front" else "hloserve_runtime")
    if not pids:
        raise RuntimeError(f"no {kind} process to kill:\n" + r.tail())
    for pid in pids if kind == "front" else pids[:1]:
        os.kill(pid, signal.SIGKILL)
    return pids[0]


class Load:
    """:func:`closed_loop` of ``senders`` on a background thread for at most ``seconds``;
    :meth:`stop` ends it and gives its outcomes."""

    def __init__(self, senders: list[Sender], seconds: float = 3600.0) -> None:
        self._stop = threading.Event()
        self._outcomes: list[Outcome] = []
        self._thread = threading.Thread(
            target=lambda: self._outcomes.extend(closed_loop(senders, seconds, self._stop)),
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> list[Outcome]:
        self._stop.set()
        self._thread.join(120)
        return self._outcomes


def kill(
    r: Rig,
    kind: str,
    hang_s: float = 10.0,
    recovery_s: float = 120.0,
    after_s: float = 2.0,
) -> Case:
    """The kill case ``kind`` under load on both targets (module docstring)."""
    case = Case(f"kill {kind}")
    senders = [Sender(t, a, 60.0) for t, a in r.targets.items()]  # within the queue bound
    load = Load(senders)
    time.sleep(1.0)
    killed_at = time.monotonic()
    pid = _kill(r, kind)
    probes = {t: Sender(t, a, 10.0) for t, a in r.targets.items()}
    recovered_at = None
    while time.monotonic() - killed_at < recovery_s:
        time.sleep(0.25)
        if all(p.send().status == "OK" for p in probes.values()):
            recovered_at = time.monotonic()
            break
    time.sleep(after_s)
    outcomes = load.stop()
    for s in [*senders, *probes.values()]:
        s.close()
    case.outcomes = outcomes
    failed = [o for o in outcomes if o.status != "OK"]
    in_flight = [o for o in failed if o.started <= killed_at <= o.started + o.seconds]
    by_target = {}
    for t in r.targets:
        statuses = Counter(o.status for o in failed if o.target == t)
        by_target[t] = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    later = [o for o in outcomes if recovered_at is not None and o.started >= recovered_at]
    recovery = (recovered_at - killed_at) if recovered_at is not None else float("inf")
    case.figures = {
        "killed": f"pid {pid}",
        "recovery": f"{recovery:.1f} s",
        "slowest failure": f"{max((o.seconds for o in failed), default=0.0):.2f} s",
        "slowest request": f"{max((o.seconds for o in outcomes), default=0.0):.2f} s",
        "in flight at the kill": ", ".join(sorted(o.status for o in in_flight)) or "none",
        **{f"failures {t}": text or "none" for t, text in by_target.items()},
    }
    case.checks = {
        f"no request hangs (all answered within {hang_s:g} s)": all(
            o.seconds <= hang_s for o in outcomes
        ),
        f"in flight at the kill: {' or '.join(s.split('.')[-1] for s in KILL_STATUSES)}": all(
            o.status in KILL_STATUSES for o in in_flight
        ),
        "later failures also NOT_FOUND at most (a restarting tritonserver before its models"
        " load)": all(o.status in (*KILL_STATUSES, "StatusCode.NOT_FOUND") for o in failed),
        f"recovered within {recovery_s:g} s": recovered_at is not None,
        "every request after recovery succeeds, correctly": bool(later)
        and all(o.status == "OK" and o.correct for o in later),
    }
    return case


def two_replicas(r: Rig, recovery_s: float = 120.0, after_s: float = 2.0) -> Case:
    """A model with two replicas (``r`` with two workers): the first worker's tritonserver
    SIGKILLed under load through the gateway (module docstring)."""
    if len(r.workers) < 2:
        raise ValueError(f"two_replicas needs a rig of 2 workers, got {len(r.workers)}")
    case = Case("kill tritonserver, two replicas, through the gateway")
    address = r.targets["gateway"]
    senders = [Sender("gateway", address, 60.0) for _ in range(2)]
    load = Load(senders)
    time.sleep(1.0)
    server = r.workers[0].tritonserver()
    if server is None:
        raise RuntimeError("no tritonserver to kill:\n" + r.tail())
    killed_at = time.monotonic()
    os.kill(server, signal.SIGKILL)
    # the killed worker is back once its tritonserver answers a request directly
    probe = Sender("direct", r.workers[0].direct, 10.0)
    recovered_at = None
    while time.monotonic() - killed_at < recovery_s:
        time.sleep(0.25)
        if probe.send().status == "OK":
            recovered_at = time.monotonic()
            break
    time.sleep(after_s)
    outcomes = load.stop()
    for s in [*senders, probe]:
        s.close()
    case.outcomes = outcomes
    failed = [o for o in outcomes if o.status != "OK"]
    in_flight = [o for o in outcomes if o.started <= killed_at <= o.started + o.seconds]
    new = [o for o in outcomes if o.started > killed_at]
    recovery = (recovered_at - killed_at) if recovered_at is not None else float("inf")
    case.figures = {
        "killed": f"tritonserver pid {server} of worker {r.workers[0].direct}",
        "requests sent after the kill": f"{len(new)}, failed {sum(o.status != 'OK' for o in new)}",
        "in flight at the kill": ", ".join(sorted(o.status for o in in_flight)) or "none",
        "killed worker serving again": f"{recovery:.1f} s",
        "slowest failure": f"{max((o.seconds for o in failed), default=0.0):.2f} s",
        "slowest request": f"{max((o.seconds for o in outcomes), default=0.0):.2f} s",
    }
    case.checks = {
        "requests sent after the kill: every one answered, correctly": bool(new)
        and all(o.status == "OK" and o.correct for o in new),
        "in flight at the kill: UNAVAILABLE or answered": all(
            o.status in ("OK", "StatusCode.UNAVAILABLE") for o in in_flight
        ),
        f"the killed worker serves again within {recovery_s:g} s": recovered_at is not None,
    }
    return case


def soak(
    r: Rig,
    seconds: float,
    reload_s: float = 60.0,
    sample_s: float = 30.0,
    from_s: float = 300.0,
    growth_limit: float = 0.05,
) -> Case:
    """The soak (module docstring): closed-loop clients through the gateway on ``slow`` and
    ``watched`` for ``seconds`` while ``watched``'s hook is rewritten every ``reload_s``
    (serve's ``--watch`` reloads it); RSS sampled every ``sample_s``, its growth measured from
    ``from_s`` (or the first sample when the soak is shorter)."""
    case = Case(f"soak through the gateway, {seconds:g} s")
    address = r.targets["gateway"]
    senders = [Sender("gateway", address, 60.0, m) for m in (MODEL, MODEL, WATCHED)]
    start = time.monotonic()
    load = Load(senders, seconds)
    hook = r.bundles / WATCHED / "model.py"
    original = hook.read_text()
    samples: list[tuple[float, int]] = []
    rewrites = 0
    next_reload, next_sample = start + reload_s, start
    for _ in range(10_000_000):
        now = time.monotonic()
        if now - start >= seconds:
            break
        if now >= next_sample:
            samples.append((now - start, r.rss()))
            next_sample += sample_s
        if now >= next_reload:
            rewrites += 1
            hook.write_text(f"{original}\n# generation {rewrites}\n")
            next_reload += reload_s
        time.sleep(0.2)
    outcomes = load.stop()
    samples.append((time.monotonic() - start, r.rss()))
    for s in senders:
        s.close()
    case.outcomes = outcomes
    ready = len(re.findall(rf"model '{WATCHED}': version \d+ READY", r.tail(10_000_000)))
    base_t, base = next(((t, b) for t, b in samples if t >= from_s), samples[0])
    end = samples[-1][1]
    growth = (end - base) / base if base else float("inf")
    failed = [o for o in outcomes if o.status != "OK" or not o.correct]
    case.figures = {
        "requests": f"{len(outcomes)} ({len(outcomes) / seconds:.1f} req/s), failed {len(failed)}",
        "bundle rewrites / reloads READY": f"{rewrites} / {ready}",
        "RSS": f"{samples[0][1] / MIB:.0f} MiB at start, {base / MIB:.0f} MiB at {base_t:.0f} s,"
        f" {end / MIB:.0f} MiB at the end ({growth * 100:+.1f}%)",
        "p50 / slowest": f"{p50(outcomes) * 1e3:.1f} ms"
        f" / {max((o.seconds for o in outcomes), default=0.0):.2f} s",
        "failures": "; ".join(sorted({f"{o.status} {o.message[:120]}" for o in failed})) or "none",
    }
    case.checks = {
        "zero failed requests": bool(outcomes) and not failed,
        "every rewrite reloaded (the last may still be settling)": ready >= max(rewrites - 1, 0),
        f"RSS growth under {growth_limit * 100:g}% from {base_t:.0f} s": growth < growth_limit,
    }
    return case


def main(argv: list[str] | None = None) -> int:
    """Run the cases of the command line; 1 when a check fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--overload-seconds", type=float, default=60.0)
    parser.add_argument("--measure-seconds", type=float, default=5.0)
    parser.add_argument(
        "--clients", type=int, default=None, help="default: queue bound + front instances"
    )
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--rss-slack-mib", type=float, default=200.0)
    parser.add_argument(
        "--kills",
        default="front,runtime,tritonserver,haproxy,replicas",
        help="comma-separated: front, runtime, tritonserver, haproxy (each on a rig of one"
        " worker, directly and through the gateway), replicas (a tritonserver of a model with"
        " two replicas, through the gateway, on a rig of two workers)",
    )
    parser.add_argument("--hang-seconds", type=float, default=10.0)
    parser.add_argument("--recovery-seconds", type=float, default=120.0)
    parser.add_argument("--soak-seconds", type=float, default=0.0, help="1800 for the full soak")
    parser.add_argument("--reload-seconds", type=float, default=60.0)
    parser.add_argument("--watch-interval", type=float, default=5.0)
    parser.add_argument("--hook-ms", type=float, default=20.0)
    parser.add_argument("--max-queue-size", type=int, default=4)
    args = parser.parse_args(argv)
    kills = [k for k in args.kills.split(",") if k]
    cases: list[Case] = []

    def report(case: Case) -> None:
        cases.append(case)
        print("\n".join(case.lines()), flush=True)

    single = [k for k in kills if k != "replicas"]
    if args.overload_seconds > 0 or single or args.soak_seconds > 0:
        watch = args.watch_interval if args.soak_seconds > 0 else None
        with rig(args.hook_ms, args.max_queue_size, watch_s=watch) as r:
            if args.overload_seconds > 0:
                for target in r.targets:
                    report(
                        overload(
                            r, target, args.overload_seconds, args.measure_seconds, args.clients,
                            args.factor, args.rss_slack_mib,
                        )
                    )  # fmt: skip
            for kind in single:
                report(kill(r, kind, args.hang_seconds, args.recovery_seconds))
            if args.soak_seconds > 0:
                report(soak(r, args.soak_seconds, args.reload_seconds))
    if "replicas" in kills:
        with rig(args.hook_ms, args.max_queue_size, workers=2) as r:
            report(two_replicas(r, args.recovery_seconds))
    failed = [c.name for c in cases if not c.passed]
    print(f"chaos: {len(cases) - len(failed)}/{len(cases)} cases passed" + (
        f"; failed: {', '.join(failed)}" if failed else ""
    ))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
