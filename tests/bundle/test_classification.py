"""Manifest ``labels:`` (a classification output's label file) and ``format:`` (an image
input's layout): where each is allowed, and the label file's count (docs/bundles.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hloserve.bundle.validate import validate_bundle
from hloserve.model_repository_tools.config import parse_config_text
from hloserve.model_repository_tools.repository_plan import plan_repository
from tests.conftest import needs_tritonclient

Edit = Callable[[Path, Callable[[dict[str, Any]], None]], None]


def errors(bundle: Path) -> list[str]:
    return [str(p) for p in validate_bundle(bundle) if not p.warning]


@needs_tritonclient
def test_a_label_file_with_one_line_per_class_is_written_as_label_filename(
    tiny_bundle: Path, edit_manifest: Edit
) -> None:
    (tiny_bundle / "classes.txt").write_text("cat\ndog\nbird\n")
    edit_manifest(tiny_bundle, lambda d: d["outputs"][0].update(labels="classes.txt"))
    assert errors(tiny_bundle) == []
    [front] = plan_repository(tiny_bundle.parent).models
    config = parse_config_text(front.config_text)
    assert [o.label_filename for o in config.output] == ["y.labels.txt", ""]


@pytest.mark.parametrize(
    ("text", "found"), [("cat\ndog\n", "got 2 lines"), ("cat\n\nbird\n", "some empty")]
)
def test_a_label_count_other_than_the_class_axis_is_refused(
    tiny_bundle: Path, edit_manifest: Edit, text: str, found: str
) -> None:
    (tiny_bundle / "classes.txt").write_text(text)
    edit_manifest(tiny_bundle, lambda d: d["outputs"][0].update(labels="classes.txt"))
    [problem] = errors(tiny_bundle)
    assert problem.startswith("classes.txt: labels of output 'y': expected 3 non-empty lines")
    assert found in problem


def test_a_missing_label_file_is_refused(tiny_bundle: Path, edit_manifest: Edit) -> None:
    edit_manifest(tiny_bundle, lambda d: d["outputs"][0].update(labels="none.txt"))
    [problem] = errors(tiny_bundle)
    assert problem.startswith("none.txt: cannot read")


@pytest.mark.parametrize(
    ("change", "found"),
    [
        (lambda d: d["inputs"][0].update(labels="l.txt"), "inputs 'x': labels is for an output"),
        (lambda d: d["outputs"][0].update(format="NHWC"), "'y': format NHWC needs three"),
        (lambda d: d["outputs"][1].update(labels="l.txt"), "labels need one non-batch axis"),
        (lambda d: d["inputs"][0].update(format="NCHW"), "format NCHW needs three non-batch"),
        (lambda d: d["inputs"][0].update(format="CHW"), "NHWC"),
        (lambda d: d["outputs"][0].update(labels="../l.txt"), "relative path inside the bundle"),
    ],
)
def test_misplaced_keys_are_refused_naming_the_tensor(
    tiny_bundle: Path, edit_manifest: Edit, change: Callable[[dict[str, Any]], None], found: str
) -> None:
    edit_manifest(tiny_bundle, change)
    assert any(found in e for e in errors(tiny_bundle)), errors(tiny_bundle)


@needs_tritonclient
def test_a_meta_models_client_tensors_take_labels_and_format_too(tmp_path: Path) -> None:
    import yaml

    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.config import parse_config

    meta = tmp_path / "src" / "pick"
    meta.mkdir(parents=True)
    image = {"name": "image", "dtype": "f32", "shape": "nhwc", "dims": {"h": 2, "w": 2, "c": 1}}
    scores = {"name": "scores", "dtype": "f32", "shape": "nk", "dims": {"k": 2}}
    manifest = {
        "format_version": 2,
        "kind": "meta",
        "meta": {"calls": []},
        "client_inputs": [{**image, "format": "NCHW"}],
        "client_outputs": [{**scores, "labels": "yes_no.txt"}],
    }
    (meta / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    (meta / "model.py").write_text("def run(inputs, call):\n    return {}\n")
    (meta / "yes_no.txt").write_text("yes\nno\n")
    assert errors(meta) == []
    repo = tmp_path / "repo"
    build_repository(meta.parent, repo)
    config = parse_config(repo / "pick" / "config.pbtxt")
    assert config.input[0].format == config.input[0].FORMAT_NCHW
    assert config.output[0].label_filename == "scores.labels.txt"
    assert (repo / "pick" / "scores.labels.txt").read_text() == "yes\nno\n"
