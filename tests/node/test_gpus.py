"""GPU assignment of ``serve`` and ``node up``: one worker per GPU, each seeing only its GPU.

GPU detection is faked only at the ``nvidia-smi`` boundary: a script on PATH answering
``--query-gpu=index,uuid`` as the real one does (NVML's ``pynvml`` is not installed here).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from hloserve.errors import GpuNotFoundError, InvalidArgumentError
from hloserve.node.plan import assign_gpus, detect_gpus
from hloserve.node.procfs import session_pids

UUIDS = ("GPU-0a1b2c3d-0000-0000-0000-000000000000", "GPU-0a1b2c3d-1111-1111-1111-111111111111")


def fake_nvidia_smi(directory: Path, count: int = 2) -> Path:
    """An ``nvidia-smi`` in ``directory`` listing ``count`` (at most 2) GPUs: index, uuid."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    lines = "".join(f"{i}, {UUIDS[i]}\\n" for i in range(count))
    script.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


@pytest.fixture
def two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    return bin_dir


def test_detection_reads_nvidia_smi_and_inherited_visible_devices(two_gpus: Path) -> None:
    assert detect_gpus({}) == (0, 1)
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "1"}) == (1,)
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": f"{UUIDS[1]},0"}) == (1, 0)
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "0,7,1"}) == (0,)  # CUDA stops at 7


def test_assignment_follows_gpus_and_workers() -> None:
    assert assign_gpus(None, None, (0, 1)) == [0, 1]  # one worker per visible GPU
    assert assign_gpus(None, None, ()) == [None]  # no GPU: one CPU worker
    assert assign_gpus(None, 1, (0, 1)) == [0]  # --workers alone: the first N
    assert assign_gpus(None, 3, ()) == [None] * 3
    assert assign_gpus("all", None, (2, 3)) == [2, 3]
    assert assign_gpus("1", None, (0, 1)) == [1]
    assert assign_gpus("none", 2, (0, 1)) == [None, None]
    assert assign_gpus("0,1", 2, (0, 1)) == [0, 1]
    with pytest.raises(InvalidArgumentError, match=r"--workers 3 and --gpus 0,1 .* disagree"):
        assign_gpus("0,1", 3, (0, 1))
    with pytest.raises(InvalidArgumentError, match=r"--workers 3 but 2 GPU\(s\) visible"):
        assign_gpus(None, 3, (0, 1))
    with pytest.raises(GpuNotFoundError, match="GPU 5 asked for but the visible GPUs are 0,1"):
        assign_gpus("0,5", None, (0, 1))
    with pytest.raises(GpuNotFoundError, match="GPU asked for but none is visible"):
        assign_gpus("all", None, ())
    with pytest.raises(InvalidArgumentError, match="all, none or indices"):
        assign_gpus("first", None, (0,))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").partition("=")[::2] for e in raw if b"=" in e)


@pytest.mark.tritonserver
@pytest.mark.timeout(420)
def test_each_worker_and_every_stub_sees_only_its_gpu(two_gpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc")
    from tests.conftest import GOLDEN
    from tests.node.test_serve_cli import serve_two_workers, stop_serve, wait_for_line

    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    log = tmp_path / "serve.log"
    proc, *_ = serve_two_workers(bundles, log, "--gpus", "0,1", "--device-memory-fraction", "0.6")
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 360)
        text = log.read_text()
        workers = dict(re.findall(r"worker (\d) tritonserver \(pid (\d+)\) on GPU", text))
        assert sorted(workers) == ["0", "1"], text
        for index, server in workers.items():
            members = session_pids(int(server))
            stubs = [p for p in members if b"python_backend_stub" in _cmdline(p)]
            assert len(stubs) >= 2, (index, members)  # the runtime and the front at least
            runtimes = [p for p in stubs if b"hloserve_runtime" in _cmdline(p)]
            assert len(runtimes) == 1, (index, [_cmdline(p) for p in stubs])
            for pid in members:
                env = _environ(pid)
                assert env.get("CUDA_VISIBLE_DEVICES") == index, (index, pid, _cmdline(pid))
                assert env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", (index, pid)
                assert "JAX_PLATFORMS" not in env, (index, pid)  # GPU workers: the runtime's GPU
            # the launcher gave the runtime its allocator settings (not the stub's own setenv,
            # which /proc/<pid>/environ would not show): no preallocation, --device-memory-fraction
            env = _environ(runtimes[0])
            assert env.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false", (index, env)
            assert env.get("XLA_CLIENT_MEM_FRACTION") == "0.6", (index, env)
    finally:
        stop_serve(proc)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _documented_commands() -> list[tuple[dict[str, str], list[str], str]]:
    """docs/deployment.md's "GPUs and workers" table: (environment, serve's arguments, workers)."""
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "deployment.md").read_text()
    table = text.split("<!-- gpu-table:", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[3:]:
        command, workers = (cell.strip().strip("`") for cell in line.strip("|").split("|"))
        words = command.split()
        env = dict(w.split("=", 1) for w in words[: words.index("hloserve")])
        rows.append((env, words[words.index("serve") + 1 :], workers))
    return rows


def test_the_documented_gpu_commands_give_the_documented_workers(
    two_gpus: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from hloserve.cli import build_parser
    from hloserve.errors import HloserveError
    from hloserve.node.plan import device_name
    from hloserve.node.serve_options import ServeOptions, serve_gpus

    rows = _documented_commands()
    assert len(rows) >= 6
    for env, args, expected in rows:
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            parsed = build_parser().parse_args(["serve", *args])
            options = ServeOptions(path=tmp_path, workers=parsed.workers, gpus=parsed.gpus)
            try:
                gpus = serve_gpus(options)
            except HloserveError as exc:
                assert expected.startswith("error: "), (args, str(exc))
                assert expected[len("error: ") :] in str(exc), (args, str(exc))
                continue
            shown = ", ".join(device_name(g) for g in gpus)
            if len(gpus) > 1:
                shown += " (gateway in front)"
            assert shown == expected, (env, args)


@pytest.mark.parametrize("backend", ["hloserve_front", "hloserve_meta"])
def test_front_and_meta_shims_put_jax_on_the_cpu_before_any_hloserve_import(backend: str) -> None:
    """A front or meta stub inherits its worker's GPU; its JAX must not open it (the runtime's
    stub, which never imports :mod:`hloserve.jax_on_cpu`, keeps it)."""
    import ast

    import hloserve

    root = Path(hloserve.__file__).parent / "triton_backend" / "backends"
    tree = ast.parse((root / backend / "model.py").read_text())
    imported = [
        alias.name if isinstance(node, ast.Import) else (node.module or "")
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    ours = [name for name in imported if name.startswith("hloserve")]
    assert ours[0] == "hloserve.jax_on_cpu", ours
    runtime = (root / "hloserve_runtime" / "model.py").read_text()
    assert "jax_on_cpu" not in runtime
