"""The rules of ``serve --watch`` without a server: fingerprints, debounce, dependency order,
version folders, and the watcher's decisions against a recording stand-in for Triton's API."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tritonclient.grpc.model_config_pb2")  # the serving env (repositories)
pytest.importorskip("prometheus_client")  # the admin port

from hloserve.errors import InvalidArgumentError
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.build_options import BuildOptions
from hloserve.model_repository_tools.config import parse_config
from hloserve.model_repository_tools.validate import validate_repository
from hloserve.node.model_control_client import error_text
from hloserve.node.serve_options import ServeOptions, check_options
from hloserve.node.status import render_models
from hloserve.node.watcher import (
    BundleWatcher,
    Changes,
    Debouncer,
    ModelRecord,
    callers,
    dependency_order,
    fingerprint,
    install_version,
    model_rows,
    model_versions,
    prune_versions,
    roll_back,
    scan,
)
from hloserve.observability.supervisor import NodeAdminServer, NodeMetrics
from tests.conftest import GOLDEN

GOLDEN_WEIGHTS = GOLDEN / "affine" / "weights.safetensors"
META_MANIFEST = """\
format_version: 2
kind: meta
meta:
  calls: [a]
client_inputs:
  - {name: x, dtype: f32, shape: nk, dims: {k: 4}}
client_outputs:
  - {name: y, dtype: f32, shape: nj, dims: {j: 3}}
"""
META_RUN = textwrap.dedent(
    """\
    def run(inputs, call):
        return {"y": call("a", {"x": inputs["x"]}, ["y"])["y"]}
    """
)


def write_meta(bundles: Path, name: str = "m") -> Path:
    """A meta bundle ``name`` calling ``a`` (y = a(x).y)."""
    meta = bundles / name
    meta.mkdir()
    (meta / "manifest.yaml").write_text(META_MANIFEST)
    (meta / "model.py").write_text(META_RUN)
    return meta


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` as editors and exporters do: write beside it, then rename over it."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# -- fingerprints and debounce ------------------------------------------------------------------


def test_fingerprint_sees_a_renamed_file_of_equal_size_and_time(tmp_path: Path) -> None:
    bundle = tmp_path / "a"
    shutil.copytree(GOLDEN / "affine", bundle)
    before = fingerprint(bundle)
    weights = bundle / "weights.safetensors"
    stat = weights.stat()
    replace_file(weights, weights.read_bytes())
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert fingerprint(bundle) != before  # the inode tells


def test_fingerprint_ignores_hidden_files_and_pycache(tmp_path: Path) -> None:
    bundle = tmp_path / "a"
    shutil.copytree(GOLDEN / "affine", bundle)
    before = fingerprint(bundle)
    (bundle / ".manifest.yaml.swp").write_text("editor")
    (bundle / "__pycache__").mkdir()
    (bundle / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"\0")
    assert fingerprint(bundle) == before
    (bundle / "notes.txt").write_text("a new file")
    assert fingerprint(bundle) != before


def test_scan_lists_only_folders_with_a_manifest(tmp_path: Path) -> None:
    shutil.copytree(GOLDEN / "affine", tmp_path / "a")
    (tmp_path / "half-copied").mkdir()
    assert set(scan(tmp_path)) == {"a"}


def test_debouncer_acts_once_two_polls_see_the_same_content() -> None:
    one, two, three = (("w", 1, 1, 1),), (("w", 1, 2, 2),), (("w", 1, 3, 3),)
    debounce = Debouncer({"a": one})
    assert not debounce.poll({"a": one})
    assert not debounce.poll({"a": two})  # first sight of the change: wait
    assert not debounce.poll({"a": three})  # still changing
    assert debounce.poll({"a": three}) == Changes(changed=("a",))
    assert not debounce.poll({"a": three})  # acted on: not again
    assert debounce.acted == {"a": three}


def test_debouncer_forgets_a_change_undone_before_it_settled() -> None:
    one, two = (("w", 1, 1, 1),), (("w", 1, 2, 2),)
    debounce = Debouncer({"a": one})
    assert not debounce.poll({"a": two})
    assert not debounce.poll({"a": one})  # back as it was
    assert not debounce.poll({"a": one})


def test_debouncer_reports_added_and_removed_bundles() -> None:
    one = (("w", 1, 1, 1),)
    debounce = Debouncer({"a": one})
    assert not debounce.poll({"a": one, "b": one})
    assert debounce.poll({"a": one, "b": one}) == Changes(added=("b",))
    assert not debounce.poll({"b": one})
    assert debounce.poll({"b": one}) == Changes(removed=("a",))
    assert debounce.acted == {"b": one}
    assert not debounce.poll({"b": one, "a": one})  # back again: added once it holds still
    assert debounce.poll({"b": one, "a": one}) == Changes(added=("a",))


def test_dependency_order_puts_callees_first_and_finds_callers() -> None:
    calls = {"m": ("a", "b"), "n": ("m",)}
    assert dependency_order(["n", "m", "b", "a"], calls) == ["a", "b", "m", "n"]
    assert dependency_order(["m", "z"], calls) == ["m", "z"]  # callees not being ordered
    assert callers(["a"], calls) == {"m", "n"}
    assert callers(["z"], calls) == set()


def test_model_rows_join_triton_index_and_records() -> None:
    index = [
        {"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "a", "version": "2", "state": "READY"},
        {"name": "hloserve_runtime", "version": "1", "state": "READY"},
    ]
    records = [ModelRecord("a", 2, "READY", 1.5e9), ModelRecord("b", 0, "UNLOADED", 1.6e9)]
    rows = model_rows(index, records)
    assert [(r["name"], r["version"], r["state"]) for r in rows] == [
        ("a", "2", "READY"),
        ("b", "", "UNLOADED"),
        ("hloserve_runtime", "1", "READY"),
    ]
    assert rows[0]["last_reload"] == 1.5e9 and rows[2]["last_reload"] is None


# -- version folders ----------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, Path]:
    """(bundles dir holding ``a``, the repository built from it)."""
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "a")
    repo = tmp_path / "repository"
    build_repository(bundles, repo, front_instances=1)
    return bundles, repo


def staged_copy(repo: Path, tmp_path: Path) -> Path:
    staged = tmp_path / "staged" / "a"
    shutil.copytree(repo / "a", staged)
    return staged


def test_install_version_adds_a_version_folder_and_points_the_config_at_it(
    served: tuple[Path, Path], tmp_path: Path
) -> None:
    _, repo = served
    before = (repo / "a" / "config.pbtxt").read_text()
    installed = install_version(staged_copy(repo, tmp_path), repo, "a")
    assert installed.version == 2 and model_versions(repo / "a") == [1, 2]
    config = parse_config(repo / "a" / "config.pbtxt")
    assert config.parameters["hloserve.bundle"].string_value == "2/bundle"
    assert (repo / "a" / "2" / "bundle" / "manifest.yaml").is_file()
    assert [p for p in validate_repository(repo) if not p.warning] == []  # repo validate agrees
    roll_back(installed)
    assert model_versions(repo / "a") == [1]
    assert (repo / "a" / "config.pbtxt").read_text() == before


def test_install_version_of_a_new_model_and_its_roll_back(
    served: tuple[Path, Path], tmp_path: Path
) -> None:
    _, repo = served
    staged = staged_copy(repo, tmp_path)
    installed = install_version(staged, repo, "b")
    assert installed.previous_config is None and model_versions(repo / "b") == [1]
    roll_back(installed)
    assert not (repo / "b").exists()


def test_prune_keeps_the_current_and_the_previous_version(
    served: tuple[Path, Path], tmp_path: Path
) -> None:
    _, repo = served
    for i in range(3):
        install_version(staged_copy(repo, tmp_path / str(i)), repo, "a")
    prune_versions(repo / "a", keep_from=3)
    assert model_versions(repo / "a") == [3, 4]


# -- the watcher's decisions ----------------------------------------------------------------------


class Recorder:
    """Triton's repository API as the watcher sees it; ``fail`` names models whose load fails."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail: set[str] = set()

    def load(self, model: str) -> None:
        self.calls.append(("load", model))
        if model in self.fail:
            raise RuntimeError(f"failed to load '{model}': compile error")

    def reload(self, model: str) -> None:
        self.calls.append(("reload", model))

    def unload(self, model: str) -> None:
        self.calls.append(("unload", model))


def settle(watcher: BundleWatcher) -> Changes:
    """Two polls: the second acts on what the first saw."""
    assert not watcher.poll_once()
    return watcher.poll_once()


def make_watcher(bundles: Path, repo: Path) -> tuple[BundleWatcher, Recorder, list[str]]:
    control, lines = Recorder(), []
    watcher = BundleWatcher(
        bundles,
        repo,
        control,
        scan(bundles),
        build=BuildOptions(front_instances=1),
        report=lines.append,
    )
    return watcher, control, lines


def test_changed_bundle_becomes_a_new_version_and_is_loaded(served: tuple[Path, Path]) -> None:
    bundles, repo = served
    watcher, control, lines = make_watcher(bundles, repo)
    weights = bundles / "a" / "weights.safetensors"
    replace_file(weights, weights.read_bytes())
    assert settle(watcher) == Changes(changed=("a",))
    assert control.calls == [("load", "a")]
    assert model_versions(repo / "a") == [1, 2]
    config = parse_config(repo / "a" / "config.pbtxt")
    assert config.parameters["hloserve.bundle"].string_value == "2/bundle"
    [record] = watcher.records()
    assert (record.version, record.state, record.error) == (2, "READY", "")
    assert record.last_reload is not None
    assert any("version 2 READY" in line for line in lines)


def test_invalid_bundle_is_not_loaded_and_its_error_recorded(served: tuple[Path, Path]) -> None:
    bundles, repo = served
    watcher, control, lines = make_watcher(bundles, repo)
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    (bundles / "a" / "manifest.yaml").write_text("format_version: 1\nkind: model\n")
    assert settle(watcher) == Changes(changed=("a",))
    assert control.calls == []  # Triton never hears of it: version 1 keeps serving
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before
    [record] = watcher.records()
    assert (record.version, record.state) == (1, "FAILED")
    assert "'a'" in record.error and "invalid" in record.error
    assert any("validation failed (version 1 keeps serving)" in line for line in lines)
    assert not watcher.poll_once()  # the same broken content is not tried again


def test_failed_load_rolls_the_repository_back(served: tuple[Path, Path]) -> None:
    bundles, repo = served
    watcher, control, _ = make_watcher(bundles, repo)
    config = (repo / "a" / "config.pbtxt").read_text()
    control.fail.add("a")
    replace_file(
        bundles / "a" / "weights.safetensors", (bundles / "a" / "weights.safetensors").read_bytes()
    )
    settle(watcher)
    assert control.calls == [("load", "a")]
    assert model_versions(repo / "a") == [1]
    assert (repo / "a" / "config.pbtxt").read_text() == config
    [record] = watcher.records()
    assert record.state == "FAILED" and "compile error" in record.error


def test_added_and_removed_bundles_are_loaded_and_unloaded(served: tuple[Path, Path]) -> None:
    bundles, repo = served
    watcher, control, _ = make_watcher(bundles, repo)
    shutil.copytree(GOLDEN / "affine", bundles / "b")
    assert settle(watcher) == Changes(added=("b",))
    assert control.calls == [("load", "b")] and model_versions(repo / "b") == [1]
    shutil.rmtree(bundles / "b")
    assert settle(watcher) == Changes(removed=("b",))
    assert control.calls[-1] == ("unload", "b") and not (repo / "b").exists()
    states = {r.name: r.state for r in watcher.records()}
    assert states == {"a": "READY", "b": "UNLOADED"}


def test_meta_reloads_after_its_callee_and_loads_after_it(tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "a")
    write_meta(bundles)
    repo = tmp_path / "repository"
    build_repository(bundles, repo, front_instances=1)
    watcher, control, _ = make_watcher(bundles, repo)
    replace_file(
        bundles / "a" / "weights.safetensors", (bundles / "a" / "weights.safetensors").read_bytes()
    )
    settle(watcher)
    assert control.calls == [("load", "a"), ("reload", "m")]
    # both changed at once: the callee loads first, the meta is loaded (not reloaded twice)
    replace_file(
        bundles / "a" / "weights.safetensors", (bundles / "a" / "weights.safetensors").read_bytes()
    )
    (bundles / "m" / "model.py").write_text(META_RUN + "# edited\n")
    control.calls.clear()
    settle(watcher)
    assert control.calls == [("load", "a"), ("load", "m")]
    assert model_versions(repo / "m") == [1, 2]
    assert [p for p in validate_repository(repo) if not p.warning] == []


def test_meta_calling_a_model_not_served_is_refused(served: tuple[Path, Path]) -> None:
    bundles, repo = served
    watcher, control, _ = make_watcher(bundles, repo)
    meta = write_meta(bundles, "m")
    (meta / "manifest.yaml").write_text(META_MANIFEST.replace("[a]", "[ghost]"))
    settle(watcher)
    assert control.calls == []
    record = {r.name: r for r in watcher.records()}["m"]
    assert record.state == "FAILED" and record.version == 0 and "ghost" in record.error


def test_watch_refuses_a_model_repository(served: tuple[Path, Path]) -> None:
    _, repo = served
    with pytest.raises(InvalidArgumentError, match="--watch needs a bundles directory"):
        check_options(ServeOptions(path=repo, watch=True))


def test_load_errors_lose_the_python_backend_traceback() -> None:
    exc = RuntimeError("failed to load 'm': broken on purpose\n\nAt:\n  core.py(315): load_run\n")
    assert error_text(exc) == "failed to load 'm': broken on purpose"


def test_render_models_one_line_per_model() -> None:
    rows = [
        {"name": "a", "version": "2", "state": "READY", "reason": "", "last_reload": 1.7e9,
         "error": "bundle 'a' is invalid:\n  manifest.yaml: inputs: not a list"},
        {"name": "b", "version": "", "state": "UNLOADED", "reason": "", "last_reload": 1.7e9,
         "error": ""},
        {"name": "hloserve_runtime", "version": "1", "state": "UNAVAILABLE",
         "reason": "unloaded", "last_reload": None, "error": ""},
    ]  # fmt: skip
    lines = render_models(rows).splitlines()
    assert lines[0].split() == ["model", "version", "state", "last", "reload", "error"]
    assert lines[1].split()[:3] == ["a", "2", "READY"]
    assert lines[1].endswith("bundle 'a' is invalid: manifest.yaml: inputs: not a list")
    assert lines[2].split()[:3] == ["b", "-", "UNLOADED"] and lines[2].endswith(" -")
    assert lines[3].split() == ["hloserve_runtime", "1", "UNAVAILABLE", "-", "unloaded"]


def test_admin_port_answers_models_once_given_a_list() -> None:
    import json
    import urllib.error
    import urllib.request

    admin = NodeAdminServer(NodeMetrics(["worker0"]), "127.0.0.1", 0)
    admin.start()
    url = f"http://127.0.0.1:{admin.port}/models"
    try:
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url, timeout=10)
        assert missing.value.code == 404
        missing.value.close()
        admin.models = lambda: [{"name": "a", "version": "1", "state": "READY"}]
        with urllib.request.urlopen(url, timeout=10) as response:
            assert json.loads(response.read()) == {
                "models": [{"name": "a", "version": "1", "state": "READY"}]
            }

        def down() -> list[dict[str, str]]:
            raise ConnectionRefusedError("tritonserver is not answering")

        admin.models = down
        with pytest.raises(urllib.error.HTTPError) as unavailable:
            urllib.request.urlopen(url, timeout=10)
        assert unavailable.value.code == 503
        unavailable.value.close()
    finally:
        admin.close()


def test_meta_and_its_callee_added_together_load_callee_first(tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "z")
    repo = tmp_path / "repository"
    build_repository(bundles, repo, front_instances=1)
    watcher, control, _ = make_watcher(bundles, repo)
    shutil.copytree(GOLDEN / "affine", bundles / "zz")
    meta = write_meta(bundles, "a_meta")  # sorts before its callee
    (meta / "manifest.yaml").write_text(META_MANIFEST.replace("[a]", "[zz]"))
    settle(watcher)
    assert control.calls == [("load", "zz"), ("load", "a_meta")]


def test_meta_refused_for_a_missing_callee_loads_once_the_callee_serves(
    served: tuple[Path, Path],
) -> None:
    bundles, repo = served
    watcher, control, _ = make_watcher(bundles, repo)
    meta = write_meta(bundles, "m")
    (meta / "manifest.yaml").write_text(META_MANIFEST.replace("[a]", "[late]"))
    settle(watcher)
    assert control.calls == [] and "late" in watcher.records()[-1].error
    shutil.copytree(GOLDEN / "affine", bundles / "late")
    settle(watcher)
    assert control.calls == [("load", "late"), ("load", "m")]
    assert {r.name: r.state for r in watcher.records()}["m"] == "READY"


def test_an_unexpected_error_fails_only_its_own_model(
    served: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hloserve.node.watcher as watcher_module

    bundles, repo = served
    watcher, control, lines = make_watcher(bundles, repo)
    real = watcher_module.install_version

    def disk_full(staged: Path, repository: Path, name: str) -> Any:
        if name == "a":
            raise OSError(28, "No space left on device")
        return real(staged, repository, name)

    monkeypatch.setattr(watcher_module, "install_version", disk_full)
    replace_file(bundles / "a" / "weights.safetensors", GOLDEN_WEIGHTS.read_bytes())
    shutil.copytree(GOLDEN / "affine", bundles / "b")
    settle(watcher)
    assert control.calls == [("load", "b")]
    records = {r.name: r for r in watcher.records()}
    assert records["a"].state == "FAILED" and "No space left on device" in records["a"].error
    assert records["b"].state == "READY"
    assert any("model 'a': change failed (version 1 keeps serving)" in line for line in lines)


class _Recorder:
    """A worker's model control that records calls and can be told to fail (pure logic)."""

    def __init__(self, url: str, calls: list[str], fail: str = "") -> None:
        self.http_url, self._calls, self._fail = url, calls, fail

    def _do(self, what: str) -> None:
        if what == self._fail:
            raise RuntimeError(f"failed to load: {what}\n\nAt:\n  stub traceback")
        self._calls.append(f"{self.http_url} {what}")

    def load(self, model: str) -> None:
        self._do(f"load {model}")

    def reload(self, model: str) -> None:
        self._do(f"reload {model}")

    def unload(self, model: str) -> None:
        self._do(f"unload {model}")

    def index(self) -> list[dict[str, str]]:
        return [{"name": "a", "state": "READY", "source": self.http_url}]


def test_fleet_model_control_makes_each_change_on_every_running_worker() -> None:
    from hloserve.node.model_control_client import FleetModelControl

    calls: list[str] = []
    running = {0: True, 1: False, 2: True}
    workers = [_Recorder(f"w{i}", calls, fail="load bad" if i == 2 else "") for i in range(3)]
    fleet = FleetModelControl(workers, running.__getitem__)  # type: ignore[arg-type]
    fleet.load("a")
    fleet.reload("m")
    fleet.unload("b")
    assert calls == ["w0 load a", "w2 load a", "w0 reload m", "w2 reload m", "w0 unload b",
                     "w2 unload b"]  # fmt: skip
    with pytest.raises(RuntimeError) as failed:  # the failing worker named, no traceback
        fleet.load("bad")
    assert str(failed.value) == "worker 2 (w2): failed to load: load bad"
    assert calls[-1] == "w0 load bad"  # worker 0 already serves it; worker 2 keeps the old
    assert fleet.index()[0]["source"] == "w0"
    running[0] = False
    assert fleet.index()[0]["source"] == "w2"
    running[2] = False
    assert fleet.index() == []
