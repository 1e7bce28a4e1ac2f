"""The front spec: repo build writes it from the typed manifest, the front reads it without the
typed manifest's imports (pydantic, PyYAML), and repo validate catches a stale one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tritonclient.grpc.model_config_pb2")  # repo build writes Triton configs

from hloserve import names
from hloserve.bundle.bundle import load_bundle
from hloserve.bundle.front_spec import FrontSpec, front_spec, read_front_spec
from hloserve.errors import InvalidArgumentError, Status
from hloserve.model_parameters import ModelArgs
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.validate import validate_repository
from hloserve.triton_backend.front.core import FrontModel
from tests.conftest import GOLDEN
from tests.echo_bundle import export_echo

pytestmark = pytest.mark.usefixtures("restore_x64")


@pytest.fixture(scope="module")
def repo(
    tmp_path_factory: pytest.TempPathFactory, tiny_bundle_src: Path, symbolic_digits: Path
) -> Path:
    from hloserve.export import OutputSpec, TensorSpec, export_bundle

    root = tmp_path_factory.mktemp("front_spec")
    bundles = root / "bundles"
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    shutil.copytree(tiny_bundle_src, bundles / "tiny")
    shutil.copytree(symbolic_digits, bundles / "digits")
    export_echo(bundles / "echo")  # client tensors, hooks, variants
    export_bundle(
        lambda p, x: (x * 2.0, x.sum(axis=1)),
        {},
        [TensorSpec(name="x", dtype="f32", shape="ns", dims={"s": -1})],
        [OutputSpec("y", "ns"), OutputSpec("total", "n")],
        [1, 4],
        bundles / "seqsum",
        variants=[{"s": 4}, {"s": 2}],
    )
    build_repository(bundles, root / "repository", front_instances=1)
    return root / "repository"


FRONTS = ["affine", "digits", "echo", "seqsum", "tiny"]


@pytest.mark.parametrize("model", FRONTS)
def test_the_written_spec_is_the_manifests(repo: Path, model: str) -> None:
    written = read_front_spec(repo / model / names.FRONT_SPEC)
    manifest = load_bundle(repo / model / names.BUNDLE_SUBDIR, name=model).manifest
    assert written == front_spec(manifest)
    assert [t.name for t in written.inputs] == [t.name for t in manifest.inputs]
    assert [t.name for t in written.wire_outputs] == [t.name for t in manifest.wire_outputs]
    assert written.batched == manifest.batched
    assert written.batch_leading == manifest.batch_leading
    assert list(written.compiled_batch_sizes) == manifest.batching.compiled_batch_sizes
    for t, m in zip(written.outputs, manifest.outputs, strict=True):
        assert (t.batch_axis, t.variable_axes, t.shape_at(3)) == (
            m.batch_axis,
            m.variable_axes,
            m.shape_at(3),
        )
    assert FrontSpec.from_json(written.to_json()) == written


def test_values_of_a_spec(repo: Path) -> None:
    digits = read_front_spec(repo / "digits" / names.FRONT_SPEC)
    assert digits.symbolic and digits.batched and digits.compiled_batch_sizes  # chosen at build
    seqsum = read_front_spec(repo / "seqsum" / names.FRONT_SPEC)
    assert [dict(d) for d in seqsum.variant_dims] == [{"s": 4}, {"s": 2}]
    assert seqsum.inputs[0].shape_at(2, {"s": 4}) == (2, 4)
    echo = read_front_spec(repo / "echo" / names.FRONT_SPEC)
    assert echo.client_inputs is not None and echo.client_inputs[0].dtype == "bytes"
    affine = read_front_spec(repo / "affine" / names.FRONT_SPEC)
    assert affine.compiled_batch_sizes == (1, 2) and affine.weights_order
    assert sorted(affine.all_executables) == [(0, 1), (0, 2)]


def _args(repo: Path, model: str) -> ModelArgs:
    params = {names.PARAM_BUNDLE: names.BUNDLE_SUBDIR}
    return ModelArgs(
        name=model,
        model_dir=repo / model,
        version="1",
        config={"parameters": {k: {"string_value": v} for k, v in params.items()}},
    )


@pytest.mark.parametrize("model", FRONTS)
def test_the_front_from_its_spec_is_the_front_from_the_manifest(repo: Path, model: str) -> None:
    front = FrontModel.from_args(_args(repo, model))
    bundle = load_bundle(repo / model / names.BUNDLE_SUBDIR)
    assert front.manifest == FrontModel(model, bundle).manifest
    assert front.bundle.path == repo / model / names.BUNDLE_SUBDIR


def test_a_repository_without_spec_files_still_serves(repo: Path, tmp_path: Path) -> None:
    old = tmp_path / "repository"
    shutil.copytree(repo, old)
    (old / "tiny" / names.FRONT_SPEC).unlink()  # built before the builder wrote one
    front = FrontModel.from_args(_args(old, "tiny"))
    assert front.manifest == read_front_spec(repo / "tiny" / names.FRONT_SPEC)
    assert validate_repository(old) == []


def test_a_stale_or_damaged_spec_is_reported(repo: Path, tmp_path: Path) -> None:
    copy = tmp_path / "repository"
    shutil.copytree(repo, copy)
    path = copy / "affine" / names.FRONT_SPEC
    data = json.loads(path.read_text())
    data["compiled_batch_sizes"] = [1, 2, 4]
    path.write_text(json.dumps(data))
    problems = [str(p) for p in validate_repository(copy)]
    assert problems == [
        f"affine/{names.FRONT_SPEC}: does not match the bundle's manifest (rebuild the repository)"
    ], problems
    data["format"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidArgumentError, match="front spec format 99 is not 1") as info:
        FrontModel.from_args(_args(copy, "affine"))
    assert info.value.status is Status.INVALID_ARGUMENT and "hloserve repo build" in str(info.value)
    del data["inputs"]
    data["format"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidArgumentError, match="malformed front spec"):
        read_front_spec(path)
    path.write_text("{")
    assert "not valid JSON" in str(validate_repository(copy)[0])


def test_the_front_imports_no_typed_manifest(repo: Path) -> None:
    params = {names.PARAM_BUNDLE: {"string_value": names.BUNDLE_SUBDIR}}
    code = f"""
import sys
from pathlib import Path
import hloserve.triton_backend.front.front_channel
from hloserve.triton_backend.front.core import FrontModel
from hloserve.model_parameters import ModelArgs
for model in ("affine", "echo"):
    config = {{"parameters": {params!r}}}
    args = ModelArgs(model, Path({str(repo)!r}) / model, "1", config=config)
    FrontModel.from_args(args)
bad = ("pydantic", "yaml", "hloserve.bundle.manifest", "hloserve.bundle.bundle", "jax")
print(sorted(m for m in bad if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
