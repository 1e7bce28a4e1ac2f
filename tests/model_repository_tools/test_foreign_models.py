"""Foreign Triton models beside bundles: detection, configs, refusals (no server started)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tritonclient.grpc.model_config_pb2")

from hloserve import names
from hloserve.errors import ForeignModelError, InvalidArgumentError, RepositoryError
from hloserve.meta.core import ForeignCallee, MetaCall, repository_describer
from hloserve.meta.deadline import Deadline
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.config import parse_config
from hloserve.model_repository_tools.foreign import plan_foreign, repository_backends
from hloserve.node.tritonserver import TritonServer
from tests.conftest import GOLDEN, serving_options

MODELS = Path(__file__).resolve().parents[1] / "foreign_models"


def _folder(root: Path, name: str, files: dict[str, str]) -> Path:
    folder = root / name
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def test_a_config_is_carried_over_as_it_is(tmp_path: Path) -> None:
    model = plan_foreign(MODELS / "plus_one")
    assert model.backend == "python" and not model.flat
    assert model.config_text == (MODELS / "plus_one" / "config.pbtxt").read_text()
    assert model.inputs == (("x", "TYPE_FP32", (4,)),) and model.max_batch_size == 8
    assert model.memory_bytes == sum(
        f.stat().st_size for f in (MODELS / "plus_one").rglob("*") if f.is_file()
    )


def test_config_name_must_match_the_folder(tmp_path: Path) -> None:
    shutil.copytree(MODELS / "plus_one", tmp_path / "other")
    with pytest.raises(ForeignModelError, match="names the model 'plus_one', but its folder is"):
        plan_foreign(tmp_path / "other")


def test_config_without_a_version_directory_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "m", {"config.pbtxt": 'backend: "python"', "model.py": ""})
    with pytest.raises(ForeignModelError, match=r"no version directory .* found \['config"):
        plan_foreign(folder)


@pytest.mark.parametrize("layout", ["model.onnx", "3/model.onnx"])
def test_onnx_without_config_gets_a_minimal_one(tmp_path: Path, layout: str) -> None:
    folder = _folder(tmp_path, "det", {layout: "not really onnx"})
    model = plan_foreign(folder)
    assert model.backend == "onnxruntime" and model.flat == (layout == "model.onnx")
    assert model.config_text.splitlines()[1:] == ['name: "det"', 'backend: "onnxruntime"']


def test_python_without_config_needs_auto_complete_or_a_description(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "py", {"model.py": "class TritonPythonModel:\n    pass\n"})
    with pytest.raises(ForeignModelError) as err:
        plan_foreign(folder)
    text = str(err.value)
    assert "a python model without a config.pbtxt" in text
    assert "hloserve.yaml with inputs and outputs" in text and "auto_complete_config" in text
    assert plan_foreign(MODELS / "times_two").backend == "python"  # defines auto_complete_config

    (folder / "hloserve.yaml").write_text(
        "max_batch_size: 4\n"
        "inputs: [{name: x, data_type: TYPE_FP32, dims: [4]}]\n"
        "outputs: [{name: y, data_type: TYPE_INT64, dims: [-1]}]\n"
        "memory_bytes: 12345\n"
    )
    model = plan_foreign(folder)
    assert model.memory_bytes == 12345 and model.inputs == (("x", "TYPE_FP32", (4,)),)
    assert "max_batch_size: 4" in model.config_text and "TYPE_INT64" in model.config_text


def test_torchscript_without_config_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "ts", {"1/model.pt": "x"})
    with pytest.raises(ForeignModelError, match=r"a TorchScript model without a config\.pbtxt"):
        plan_foreign(folder)


def test_two_backends_are_refused_unless_hloserve_yaml_says(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "two", {"model.onnx": "x", "model.py": "x"})
    with pytest.raises(ForeignModelError) as err:
        plan_foreign(folder)
    assert "model files of different backends ['model.onnx', 'model.py']" in str(err.value)
    (folder / "hloserve.yaml").write_text("backend: onnxruntime\n")
    assert plan_foreign(folder).backend == "onnxruntime"


def test_unknown_folder_is_refused_naming_its_files(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "junk", {"notes.txt": "x", "weights/w.bin": "y"})
    with pytest.raises(ForeignModelError) as err:
        plan_foreign(folder)
    assert "neither a bundle (no manifest.yaml) nor a Triton model" in str(err.value)
    assert "found ['notes.txt', 'weights/', 'weights/w.bin']" in str(err.value)


def test_bad_hloserve_yaml_is_refused(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path, "py", {"model.py": "", "hloserve.yaml": "inputs: [{name: x, data_type: F32}]"}
    )
    with pytest.raises(ForeignModelError, match=r"inputs\.0\.data_type: data_type 'F32'"):
        plan_foreign(folder)


def test_repository_holds_bundles_and_foreign_models(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(GOLDEN / "affine", src / "affine")
    for name in ("plus_one", "times_two"):
        shutil.copytree(MODELS / name, src / name)
    (src / ".hidden").mkdir()
    lines: list[str] = []
    plan = build_repository(src, tmp_path / "repo", progress=lines.append)
    assert [f.name for f in plan.foreign] == ["plus_one", "times_two"]
    assert "times_two: Triton model, backend python (flat, copied into version 1)" in lines
    repo = tmp_path / "repo"
    assert (repo / "plus_one" / "config.pbtxt").read_text() == (
        MODELS / "plus_one" / "config.pbtxt"
    ).read_text()
    assert (repo / "times_two" / "1" / "model.py").is_file()
    assert not (repo / "times_two" / "model.py").exists()
    assert parse_config(repo / "times_two" / "config.pbtxt").backend == "python"
    assert repository_backends(repo)["python"] == ["plus_one", "times_two"]
    sizes = {f.name: f.memory_bytes for f in plan.foreign}  # for the gateway's placement
    runtime = parse_config(repo / names.RUNTIME_MODEL / "config.pbtxt")
    assert runtime.parameters[names.PARAM_FOREIGN_BYTES].string_value == (
        f"plus_one={sizes['plus_one']},times_two={sizes['times_two']}"
    )
    assert sizes["plus_one"] == sum(
        f.stat().st_size for f in (MODELS / "plus_one").rglob("*") if f.is_file()
    )
    described = repository_describer(repo)("plus_one")
    assert isinstance(described, ForeignCallee) and described.max_batch_size == 8
    assert [(s.name, s.shape, s.dims) for s in described.wire_inputs] == [("x", "na", {"a": 4})]
    assert repository_describer(repo)("times_two") is None  # auto-completed: Triton checks

    sent: list[str] = []
    call = MetaCall(
        "mixer",
        ["plus_one"],
        lambda model, inputs, outputs, timeout: sent.append(model) or {"y": inputs["x"] + 1},
        Deadline.after_us(0),
        describe=repository_describer(repo),
    )
    with pytest.raises(InvalidArgumentError) as err:
        call("plus_one", {"x": np.zeros((1, 5), np.float32)})
    assert "call to model 'plus_one'" in str(err.value) and "expected shape [-1, 4]" in str(
        err.value
    )
    assert sent == []  # refused before sending
    np.testing.assert_array_equal(call("plus_one", {"x": np.ones((1, 4), np.float32)})["y"], 2)

    (src / "junk").mkdir()
    (src / "junk" / "notes.txt").write_text("x")
    with pytest.raises(RepositoryError, match="junk: neither a bundle"):
        build_repository(src, tmp_path / "repo", overwrite=True)
    assert (repo / "plus_one").is_dir()  # nothing was replaced


def test_a_missing_backend_is_refused_before_tritonserver_starts(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _folder(src, "det", {"model.onnx": "x"})
    shutil.copytree(MODELS / "plus_one", src / "plus_one")
    build_repository(src, tmp_path / "repo")
    server = TritonServer(serving_options(tmp_path / "repo"))
    with pytest.raises(InvalidArgumentError) as err:
        server.start()
    assert "det need(s) backend 'onnxruntime', which this tritonserver does not have" in str(
        err.value
    )
    assert server.pid is None
