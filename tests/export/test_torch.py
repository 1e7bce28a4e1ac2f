"""export_torch: a torch.nn.Module -> a bundle (through torchax), replayed by the compile path.

The executables run here with the runtime's compile path (no tritonserver); the served checks
are in test_torch_serve.py. Needs the ``export-torch`` extra (torch + torchax).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("torchax") is None:  # importing it directly fails on torch 2.13
    pytest.skip("needs torchax (the export-torch extra)", allow_module_level=True)

from torch import nn  # noqa: E402

from hloserve.bundle.bundle import load_bundle  # noqa: E402
from hloserve.bundle.validate import validate_bundle  # noqa: E402
from hloserve.cli import main  # noqa: E402
from hloserve.export import ExportError, OutputSpec, TensorSpec, export_torch  # noqa: E402
from hloserve.export._cli import parse_input, parse_output  # noqa: E402
from hloserve.triton_backend.runtime.compile import compile_artifact  # noqa: E402

IMAGE = TensorSpec(name="x", dtype="f32", shape="nchw", dims={"c": 3, "h": 8, "w": 8})
PROBS = OutputSpec(name="probs", shape="nk")


class Mixer(nn.Module):
    """BatchNorm, LayerNorm, GELU, multi-head attention and softmax: image -> class probs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.norm = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))  # [n, 16, 8, 8]
        tokens = nn.functional.gelu(self.norm(h.flatten(2).transpose(1, 2)))  # [n, 64, 16]
        mixed, _ = self.attn(tokens, tokens, tokens, need_weights=False)
        return torch.softmax(self.head(mixed.mean(1)), dim=-1)


def mixer(seed: int) -> Mixer:
    """A Mixer in eval mode whose BatchNorm statistics are not the defaults (0 and 1)."""
    torch.manual_seed(seed)
    model = Mixer()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return model.eval()


def run(bundle_dir: Path, batch: int, weights: list[np.ndarray], *inputs: np.ndarray) -> Any:
    exe = compile_artifact(load_bundle(bundle_dir).read_artifact(batch))
    return exe.run_numpy([*weights, *inputs])


def torch_out(model: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def mixer_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torch") / "mixer"
    lines: list[str] = []
    export_torch(mixer(0), [IMAGE], [PROBS], [1, 4], out, progress=lines.append)
    assert [line.split(":")[0] for line in lines] == ["batch size 1", "batch size 4"]
    return out


def test_mixer_equals_torch_at_every_batch_size(mixer_bundle: Path) -> None:
    bundle = load_bundle(mixer_bundle)
    assert validate_bundle(mixer_bundle) == []
    assert bundle.manifest.outputs[0].dims == {"k": 5}
    model = mixer(0)
    for batch in (1, 4):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8), dtype=np.float32)
        (got,) = run(mixer_bundle, batch, bundle.load_weights(), x)
        assert got.shape == (batch, 5)
        np.testing.assert_allclose(got, torch_out(model, x), atol=1e-4, rtol=0)


def test_parameters_and_buffers_are_weights_not_constants(mixer_bundle: Path) -> None:
    bundle = load_bundle(mixer_bundle)
    order = bundle.manifest.weights.order
    other = mixer(1)  # different parameters and BatchNorm statistics
    state = other.state_dict()
    assert {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"} <= set(order)
    assert set(order) == set(state)
    # the same executable with another module's state gives that module's outputs
    stored = bundle.load_weights()
    weights = [state[n].numpy().astype(w.dtype) for n, w in zip(order, stored, strict=True)]
    x = np.random.default_rng(7).standard_normal((4, 3, 8, 8), dtype=np.float32)
    (got,) = run(mixer_bundle, 4, weights, x)
    np.testing.assert_allclose(got, torch_out(other, x), atol=1e-4, rtol=0)
    assert not np.allclose(got, torch_out(mixer(0), x), atol=1e-3)


def test_training_mode_is_refused_with_eval_hint(tmp_path: Path) -> None:
    model = mixer(0).train()
    with pytest.raises(ExportError, match=r"training mode .*call module\.eval\(\)"):
        export_torch(model, [IMAGE], [PROBS], [1], tmp_path / "m")
    model.eval().bn.train()  # one submodule left in training mode is named
    with pytest.raises(ExportError, match=r"\['bn'\]"):
        export_torch(model, [IMAGE], [PROBS], [1], tmp_path / "m")
    assert not (tmp_path / "m").exists()


@torch.library.custom_op("hloserve_test::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    """A custom operator (torchax has no lowering for it)."""
    return x.clone()


class Airy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.airy_ai(x) + 1  # an ATen operator torchax 0.0.13 does not lower


class Opaque(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return opaque(x) + 1


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # reads a tensor's value in Python
            return x * 2
        return x


class Net(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 3, 1)
        self.body = nn.Sequential(nn.ReLU(), inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.stem(x)).mean((2, 3))


@pytest.mark.parametrize(
    ("inner", "op", "line"),
    [
        (Airy(), "aten::special_airy_ai", "airy_ai(x)"),
        (Opaque(), "hloserve_test.opaque", "opaque(x)"),
    ],
)
def test_an_op_without_lowering_names_the_op_and_the_submodule(
    inner: nn.Module, op: str, line: str, tmp_path: Path
) -> None:
    with pytest.raises(ExportError) as info:
        export_torch(Net(inner).eval(), [IMAGE], [OutputSpec("y", "nc")], [1], tmp_path / "m")
    message = str(info.value)
    assert message.startswith(f"operator {op}"), message
    assert f"submodule 'body.1' ({type(inner).__name__})" in message, message
    assert Path(__file__).name in message and line in message, message
    assert not (tmp_path / "m").exists()


def test_data_dependent_control_flow_is_named(tmp_path: Path) -> None:
    with pytest.raises(ExportError) as info:
        export_torch(Net(Branchy()).eval(), [IMAGE], [OutputSpec("y", "nc")], [1], tmp_path / "m")
    message = str(info.value)
    assert message.startswith("data-dependent control flow in submodule 'body.1' (Branchy)")
    assert "if x.sum() > 0:" in message and "torch.where" in message, message


def test_a_shape_the_module_does_not_accept_is_refused(tmp_path: Path) -> None:
    wrong = TensorSpec(name="x", dtype="f32", shape="nchw", dims={"c": 4, "h": 8, "w": 8})
    with pytest.raises(ExportError) as info:
        export_torch(mixer(0), [wrong], [PROBS], [1, 4], tmp_path / "m")
    message = str(info.value)
    assert "Mixer does not accept the declared inputs (x f32 nchw [1, 4, 8, 8])" in message
    assert "expected input[1, 4, 8, 8] to have 3 channels" in message, message
    two = [IMAGE, IMAGE.model_copy(update={"name": "y"})]
    with pytest.raises(ExportError, match=r"TypeError: .*positional argument"):
        export_torch(mixer(0), two, [PROBS], [1], tmp_path / "m")
    with pytest.raises(ExportError, match=r"needs a torch\.nn\.Module, got function"):
        export_torch(lambda x: x, [IMAGE], [PROBS], [1], tmp_path / "m")


def test_tensor_notation_follows_the_manifest_rules() -> None:
    spec = parse_input("x:f32:nchw:c=3,h=224,w=224")
    dims = {"c": 3, "h": 224, "w": 224}
    assert spec == TensorSpec(name="x", dtype="f32", shape="nchw", dims=dims)
    assert parse_input("ids:i32:ns:s=-1").variable_axes == ["s"]
    assert parse_output("logits:nk") == OutputSpec("logits", "nk")
    for bad, expected in [
        ("x:f32", "must be NAME:DTYPE:SHAPE"),
        ("x:f99:nk:k=3", "unknown dtype token 'f99'"),
        ("x:f32:nchw:c=3,h=224", "axis 'w' has no size in dims"),
        ("x:f32:nk:k=three", "'k=three' must be LETTER=SIZE"),
        ("x:f32:nbk:k=3", "two batch letters"),
    ]:
        with pytest.raises(ExportError, match=expected):
            parse_input(bad)
    with pytest.raises(ExportError, match="must be NAME:SHAPE"):
        parse_output("logits")
    with pytest.raises(ExportError, match="appears twice"):
        parse_output("logits:nkk")


def test_cli_exports_a_factory_with_progress_per_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(-1)).eval()\n"
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "bundles" / "tiny_torch"
    argv = ["export", "torch", "mymodels:build", "--input", "x:f32:nk:k=4"]
    argv += ["--output", "p:nk", "--batch-sizes", "1,8", "--out", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "tiny_torch: exporting Sequential from mymodels:build"
    assert [line.split(":")[1].strip() for line in lines[1:3]] == ["batch size 1", "batch size 8"]
    assert lines[3].startswith(f"{out}: wrote 2 executable(s), 2 weights, in ")
    assert main(["bundle", "validate", str(out)]) == 0
    assert main(argv) == 1  # exists: refused without --overwrite
    assert "exists; pass overwrite=True" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    assert main([*argv[:2], "mymodels:nothing", *argv[3:], "--overwrite"]) == 1
    assert "mymodels has no callable 'nothing'" in capsys.readouterr().err


def test_torchax_adapter_skips_only_removed_named_tensor_overloads() -> None:
    from hloserve.export import import_torchax
    from hloserve.export._torchax_compat import SKIPPED

    torchax = import_torchax()
    assert import_torchax() is torchax and hasattr(torchax, "extract_jax")
    removed = not hasattr(torch.ops.aten.prod, "dim_Dimname")  # torch >= 2.13
    assert ("aten.prod.dim_Dimname" in SKIPPED) == removed, SKIPPED
    assert all("dimname" in name.lower() or "names" in name.lower() for name in SKIPPED)
    for name in SKIPPED:  # torch really lacks them; the lenient lookup is gone again
        packet, overload = name.removeprefix("aten.").split(".")
        with pytest.raises(AttributeError, match="has no overload name"):
            getattr(getattr(torch.ops.aten, packet), overload)


class Bag(nn.Module):
    """Token ids (i64, torch's default index dtype) -> mean embedding -> logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.out = nn.Linear(8, 3)
        self.register_buffer("scale", torch.tensor(0.5, dtype=torch.float64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids).mean(1)) * self.scale.float()


def test_i64_inputs_and_f64_buffers(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    torch.manual_seed(0)
    model = Bag().eval()
    ids = TensorSpec(name="ids", dtype="i64", shape="ns", dims={"s": 5})
    bundle = export_torch(model, [ids], [OutputSpec("y", "nk")], [2], tmp_path / "bag")
    weights = dict(zip(bundle.manifest.weights.order, bundle.load_weights(), strict=True))
    assert weights["scale"].dtype == np.float32 and weights["scale"].shape == ()
    x = np.random.default_rng(0).integers(0, 50, (2, 5), dtype=np.int64)
    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)  # as the runtime process runs
    try:
        (got,) = run(bundle.path, 2, bundle.load_weights(), x)
    finally:
        jax.config.update("jax_enable_x64", previous)
    np.testing.assert_allclose(got, torch_out(model, x), atol=1e-5, rtol=0)
