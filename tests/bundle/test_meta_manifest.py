"""Meta bundles (``kind: meta``): manifest rules and the validator's checks of ``model.py``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hloserve.bundle.manifest import parse_manifest
from hloserve.bundle.validate import validate_bundle
from hloserve.errors import ManifestError

META: dict[str, Any] = {
    "format_version": 2,
    "kind": "meta",
    "meta": {"calls": ["fast", "strong"]},
    "client_inputs": [
        {"name": "image", "dtype": "f32", "shape": "nhwc", "dims": {"h": 8, "w": 8, "c": 1}}
    ],
    "client_outputs": [
        {"name": "label", "dtype": "i32", "shape": "n"},
        {"name": "stage", "dtype": "bytes", "shape": "n"},
    ],
}

RUN = "def run(inputs, call):\n    return {'label': inputs['image']}\n"


def refused(change: Any) -> str:
    data = copy.deepcopy(META)
    change(data)
    with pytest.raises(ManifestError) as info:
        parse_manifest(data)
    return str(info.value)


def test_meta_manifest_parses_and_round_trips() -> None:
    m = parse_manifest(copy.deepcopy(META))
    assert m.is_meta and m.calls == ["fast", "strong"]
    assert [s.name for s in m.wire_inputs] == ["image"]
    assert [s.dtype for s in m.wire_outputs] == ["i32", "bytes"]
    assert m.inputs == [] and m.executables == {}
    assert parse_manifest(yaml.safe_load(m.to_yaml())) == m


def test_compute_only_meta_may_call_nothing() -> None:
    data = copy.deepcopy(META)
    data["meta"] = {"calls": []}
    assert parse_manifest(data).calls == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.pop("meta"), "meta: required with kind 'meta'"),
        (lambda d: d.pop("client_inputs"), "client_inputs: required and non-empty"),
        (lambda d: d.update(client_outputs=[]), "client_outputs: required and non-empty"),
        (lambda d: d.update(executables={0: "model.mlirbc"}), "executables: not allowed"),
        (lambda d: d.update(inputs=[]), "inputs: not allowed with kind 'meta'"),
        (lambda d: d["meta"].update(calls=["fast", "fast"]), "names a model twice: ['fast']"),
        (lambda d: d["meta"].update(calls=["../x"]), "['../x'] are not model names"),
        (lambda d: d["meta"].update(timeout=3), "meta.timeout: unknown key"),
        (lambda d: d.update(format_version=1), "kind 'meta' needs format_version 2"),
    ],
)
def test_meta_manifest_refusals(change: Any, expected: str) -> None:
    assert expected in refused(change)


def test_client_tensors_on_a_model_need_version_2_and_meta_is_refused_there() -> None:
    model: dict[str, Any] = {
        "format_version": 1,
        "inputs": [{"name": "ids", "dtype": "i32", "shape": "ns", "dims": {"s": 4}}],
        "outputs": [{"name": "y", "dtype": "f32", "shape": "n"}],
        "batching": {"compiled_batch_sizes": [1]},
        "executables": {1: "model.b1.mlirbc"},
        "client_inputs": [{"name": "text", "dtype": "bytes", "shape": "n"}],
    }
    with pytest.raises(ManifestError, match="client_inputs needs format_version 2"):
        parse_manifest(copy.deepcopy(model))
    model["format_version"] = 2
    parsed = parse_manifest(copy.deepcopy(model))
    assert [s.name for s in parsed.wire_inputs] == ["text"]
    assert [s.name for s in parsed.wire_outputs] == ["y"]
    model["meta"] = {"calls": []}
    with pytest.raises(ManifestError, match="meta: only allowed with kind 'meta'"):
        parse_manifest(model)


def test_executable_tensors_still_refuse_bytes() -> None:
    data = copy.deepcopy(META)
    data.update(kind="model", inputs=[{"name": "t", "dtype": "bytes", "shape": "n"}])
    data.pop("meta")
    assert "dtype 'bytes' is not allowed on an executable tensor" in refused(
        lambda d: d.update(data)
    )


def write_meta(root: Path, name: str, run: str | None = RUN, **changes: Any) -> Path:
    path = root / name
    path.mkdir()
    data = copy.deepcopy(META)
    data.update(changes)
    (path / "manifest.yaml").write_text(yaml.safe_dump(data))
    if run is not None:
        (path / "model.py").write_text(run)
    return path


def messages(path: Path, models: dict[str, str] | None = None) -> list[str]:
    return [str(p) for p in validate_bundle(path, models=models)]


def test_valid_meta_bundle(tmp_path: Path) -> None:
    path = write_meta(tmp_path, "cascade")
    assert messages(path) == []
    assert messages(path, {"fast": "model", "strong": "model", "cascade": "meta"}) == []


def test_calls_are_checked_against_the_bundles_being_built(tmp_path: Path) -> None:
    path = write_meta(tmp_path, "cascade")
    assert messages(path, {"fast": "meta", "cascade": "meta"}) == [
        "manifest.yaml: meta.calls: model 'fast' is a meta model; a meta may only call models",
        "manifest.yaml: meta.calls: model 'strong' is not among the bundles being built "
        "['cascade', 'fast']",
    ]
    selfish = write_meta(tmp_path, "loop", meta={"calls": ["loop"]})
    assert messages(selfish) == ["manifest.yaml: meta.calls: 'loop' is this meta itself"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (None, "model.py: missing: a meta bundle needs model.py defining run(inputs, call)"),
        ("def runner(inputs, call):\n    pass\n", "model.py: does not define a top-level"),
        ("def run(inputs:\n", "model.py: line 1: syntax error"),
        (  # only the compiler refuses these (ast.parse accepts them)
            "import os\nfrom __future__ import annotations\n" + RUN,
            "model.py: line 2: syntax error: from __future__ imports must occur at the beginning",
        ),
        ("return 1\n" + RUN, "model.py: line 1: syntax error: 'return' outside function"),
        ("def run(inputs):\n    pass\n", "takes 1 positional argument(s), expected 2"),
        ("async def run(inputs, call):\n    pass\n", "run must be a plain function, not async"),
    ],
)
def test_model_py_must_define_run(tmp_path: Path, source: str | None, expected: str) -> None:
    found = messages(write_meta(tmp_path, "cascade", run=source))
    assert len(found) == 1 and expected in found[0], found


def test_model_py_is_not_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    source = f"open({str(marker)!r}, 'w').close()\n" + RUN
    assert messages(write_meta(tmp_path, "cascade", run=source)) == []
    assert not marker.exists()
