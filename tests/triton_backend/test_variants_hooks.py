"""Shape variants and hooks without Triton: manifest rules, export, front + in-process runtime.

The fronts are inline ChannelFronts over an in-process RuntimeServer
(tests/triton_backend/front_testing.py), the path the ``hloserve_front`` shim takes minus
Triton; tests/examples/test_minilm.py runs the same on a real tritonserver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.bundle.bundle import load_bundle
from hloserve.bundle.convert import convert_bundle
from hloserve.bundle.manifest import parse_manifest
from hloserve.bundle.validate import validate_bundle
from hloserve.errors import HloserveError, InvalidArgumentError, ManifestError, Status
from hloserve.export import ExportError, OutputSpec, TensorSpec, export_bundle
from hloserve.triton_backend.front.hooks import load_hooks
from hloserve.triton_backend.runtime.core import variant_label
from hloserve.triton_backend.runtime.server import RuntimeServer
from tests.echo_bundle import export_echo
from tests.triton_backend.front_testing import Execution, RecordingRuntime, front, runtime_server

pytestmark = pytest.mark.usefixtures("restore_x64")

#: byte strings that a text path tends to break: NULs (leading, embedded, trailing), empty,
#: UTF-8, invalid UTF-8, all 256 byte values, longer than the small variant.
TRICKY = [
    b"",
    b"\x00",
    b"a\x00b",
    b"trailing\x00\x00",
    "héllo wörld — 日本語".encode(),
    b"\xff\xfe not utf-8",
    bytes(range(64)),
    bytes(range(192, 256)),
]


def seqsum(params: Any, x: Any) -> Any:
    """y = 2x (per position), total = sum over the variable axis (padding adds zeros)."""
    return x * 2.0, x.sum(axis=1)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("variants")
    export_bundle(
        seqsum,
        {},
        [TensorSpec(name="x", dtype="f32", shape="ns", dims={"s": -1})],
        [OutputSpec("y", "ns"), OutputSpec("total", "n")],
        [1, 4],
        root / "seqsum",
        variants=[{"s": 4}, {"s": 2}],
    )
    return {"seqsum": root / "seqsum", "echo": export_echo(root / "echo")}


@pytest.fixture(scope="module")
def server() -> Iterator[RuntimeServer]:
    with runtime_server() as srv:
        yield srv


def _calls(server: RuntimeServer) -> list[Execution]:
    runtime = server.core
    assert isinstance(runtime, RecordingRuntime)
    return list(runtime.calls)


# -- manifest and export -------------------------------------------------------------------


def test_export_writes_one_artifact_per_variant_and_batch(bundles: dict[str, Path]) -> None:
    bundle = load_bundle(bundles["seqsum"])
    m = bundle.manifest
    assert m.format_version == 2 and m.executables == {}
    assert m.variant_dims == [{"s": 4}, {"s": 2}]
    assert sorted(m.all_executables.values()) == [
        "model.s2.b1.mlirbc",
        "model.s2.b4.mlirbc",
        "model.s4.b1.mlirbc",
        "model.s4.b4.mlirbc",
    ]
    assert m.outputs[0].dims == {"s": -1}  # follows the variable input axis
    assert m.outputs[0].shape_at(4, {"s": 2}) == (4, 2)
    assert [p for p in validate_bundle(bundle.path) if not p.warning] == []
    assert list(bundle.path.glob("*.safetensors")) == []  # no weights: nothing to share here
    assert variant_label({"s": 32}) == "s32" and variant_label({}) == ""


def _manifest(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format_version": 2,
        "inputs": [{"name": "x", "dtype": "f32", "shape": "ns", "dims": {"s": -1}}],
        "outputs": [{"name": "y", "dtype": "f32", "shape": "n"}],
        "batching": {"compiled_batch_sizes": [1]},
        "variants": {"shapes": [{"dims": {"s": 2}, "executables": {1: "a.mlirbc"}}]},
    }
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"format_version": 1}, "variants needs format_version 2 or later"),
        ({"variants": None}, "are -1 (variable) but there is no variants section"),
        (
            {"variants": {"shapes": [{"dims": {"t": 2}, "executables": {1: "a.mlirbc"}}]}},
            "dims give ['t'], expected axes ['s']",
        ),
        (
            {"variants": {"shapes": [{"dims": {"s": 2}, "executables": {4: "a.mlirbc"}}]}},
            "compiled batch size 1 has no artifact",
        ),
        ({"executables": {1: "b.mlirbc"}}, "executables: must be empty with variants"),
        (
            {"variants": {"pick": "largest", "shapes": []}},
            "variants.pick",
        ),
        (
            {"variants": {"shapes": [{"dims": {"s": 0}, "executables": {1: "a.mlirbc"}}]}},
            "variant sizes must be positive",
        ),
    ],
)
def test_variant_manifest_rules(changes: dict[str, Any], text: str) -> None:
    data = _manifest(**changes)
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ManifestError) as err:
        parse_manifest(data)
    assert text in str(err.value)


def test_valid_variant_manifest_round_trips() -> None:
    m = parse_manifest(_manifest())
    assert parse_manifest(yaml.safe_load(m.to_yaml())) == m


def test_export_refuses_variants_that_do_not_match_the_variable_axes(tmp_path: Path) -> None:
    spec = TensorSpec(name="x", dtype="f32", shape="ns", dims={"s": -1})
    with pytest.raises(ExportError, match="exactly the variable input axes"):
        export_bundle(seqsum, {}, [spec], [OutputSpec("y", "ns")], [1], tmp_path / "a")
    with pytest.raises(ExportError, match="exactly the variable input axes"):
        export_bundle(
            seqsum, {}, [spec], [OutputSpec("y", "ns")], [1], tmp_path / "b", variants=[{"t": 2}]
        )


def test_convert_rewrites_variant_text_executables(tmp_path: Path) -> None:
    from hloserve.bundle.stablehlo import is_portable_artifact

    src = tmp_path / "seq"
    export_bundle(
        seqsum,
        {},
        [TensorSpec(name="x", dtype="f32", shape="ns", dims={"s": -1})],
        [OutputSpec("y", "ns"), OutputSpec("total", "n")],
        [1],
        src,
        variants=[{"s": 2}],
    )
    import jax

    text = jax.jit(lambda x: (x * 2.0, x.sum(axis=1))).lower(np.zeros((1, 2), np.float32))
    (src / "model.s2.b1.mlir").write_text(text.as_text())
    (src / "model.s2.b1.mlirbc").unlink()
    manifest = (src / "manifest.yaml").read_text().replace("b1.mlirbc", "b1.mlir")
    (src / "manifest.yaml").write_text(manifest)
    assert convert_bundle(src) == ["model.s2.b1.mlir"]
    m = load_bundle(src).manifest
    assert m.all_executables == {(0, 1): "model.s2.b1.mlirbc"}
    assert is_portable_artifact((src / "model.s2.b1.mlirbc").read_bytes())


# -- serving: variant choice, padding, coalescing -----------------------------------------


def test_requests_run_on_the_smallest_fitting_variant_and_coalesce_within_it(
    bundles: dict[str, Path], server: RuntimeServer
) -> None:
    rng = np.random.default_rng(0)
    lengths = [1, 3, 2, 4, 2, 3, 1, 4]  # variants: s2, s4, s2, s4, s2, s4, s2, s4
    xs = [rng.normal(size=(1, n)).astype(np.float32) for n in lengths]
    with front(server, "seqsum", bundles["seqsum"]) as f:
        results = f.execute([{"x": x} for x in xs])
        # variant 1 (s2: requests 0, 2, 4, 6) first, then variant 0 (s4); 4 rows each
        assert [(e.variant, e.batch_size, e.shapes) for e in _calls(server)] == [
            (1, 4, ((4, 2),)),
            (0, 4, ((4, 4),)),
        ]
    for x, result in zip(xs, results, strict=True):
        assert not isinstance(result, Exception), result
        assert result["y"].shape == x.shape  # sliced back to the request's own length
        np.testing.assert_allclose(result["y"], x * 2.0, rtol=1e-6)
        np.testing.assert_allclose(result["total"], x.sum(axis=1), rtol=1e-5)


def test_a_request_larger_than_every_variant_fails_alone(
    bundles: dict[str, Path], server: RuntimeServer
) -> None:
    ok, too_long = np.ones((1, 2), np.float32), np.ones((1, 5), np.float32)
    with front(server, "seqsum", bundles["seqsum"]) as f:
        results = f.execute([{"x": too_long}, {"x": ok}])
        assert [e.shapes for e in _calls(server)] == [((1, 2),)]
    assert isinstance(results[0], InvalidArgumentError)
    assert "no shape variant holds sizes {'s': 5}" in str(results[0])
    assert not isinstance(results[1], Exception)


# -- hooks and BYTES -------------------------------------------------------------------------


def test_bytes_round_trip_byte_exact_through_hooks_and_runtime(
    bundles: dict[str, Path], server: RuntimeServer
) -> None:
    requests = [{"blob": np.array([item], dtype=object)} for item in TRICKY]
    requests.append({"blob": np.array(TRICKY, dtype=object)})  # one request, 8 items
    with front(server, "echo", bundles["echo"]) as f:
        results = f.execute(requests)
        calls = _calls(server)
    for request, result in zip(requests, results, strict=True):
        assert not isinstance(result, Exception), result
        assert result["blob"].dtype == object
        assert list(result["blob"]) == list(request["blob"])  # bytes ==: exact, NULs included
    # short items (<= 8 bytes) ran at l=8, the rest at l=64, each group coalesced
    widths = sorted({e.shapes[0][1] for e in calls})
    assert widths == [8, 64]


def test_hook_errors_name_the_model(tmp_path: Path, bundles: dict[str, Path]) -> None:
    import shutil

    bundle_dir = tmp_path / "echo"
    shutil.copytree(bundles["echo"], bundle_dir)
    (bundle_dir / "model.py").write_text("def postprocess(outputs):\n    return outputs\n")
    with pytest.raises(InvalidArgumentError, match="defines no preprocess"):
        load_hooks("echo", load_bundle(bundle_dir))
    (bundle_dir / "model.py").write_text("import no_such_module_here\n")
    with pytest.raises(InvalidArgumentError, match=r"model\.py failed to import: ModuleNotFound"):
        load_hooks("echo", load_bundle(bundle_dir))


def test_hook_exceptions_become_statuses(bundles: dict[str, Path], server: RuntimeServer) -> None:
    class Broken:
        def __init__(self, pre: Callable[..., Any], post: Callable[..., Any]) -> None:
            self.pre, self.post = pre, post

        def preprocess(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return self.pre(inputs)

        def postprocess(
            self, outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
        ) -> dict[str, np.ndarray]:
            return self.post(outputs)

    bundle = load_bundle(bundles["echo"])
    good = load_hooks("echo", bundle)

    def refuse(inputs: Any) -> Any:
        raise ValueError("bad text")

    with front(server, "echo", bundles["echo"], hooks=Broken(refuse, lambda o: o)) as f:
        [result] = f.execute([{"blob": np.array([b"x"], dtype=object)}])
    assert isinstance(result, InvalidArgumentError)
    assert "model 'echo': preprocess failed: ValueError: bad text" in str(result)

    broken = Broken(good.preprocess, lambda o: {"nope": 1})
    with front(server, "echo", bundles["echo"], hooks=broken) as f:
        [result] = f.execute([{"blob": np.array([b"x"], dtype=object)}])
    assert isinstance(result, HloserveError) and result.status is Status.INTERNAL
    assert "postprocess broke the client_outputs contract" in str(result)

    # the client-facing inputs are checked before preprocess
    with front(server, "echo", bundles["echo"], hooks=good) as f:
        [result] = f.execute([{"blob": np.zeros((1,), np.float32)}])
    assert isinstance(result, InvalidArgumentError)
    assert "input 'blob': expected dtype BYTES" in str(result)


def test_validator_checks_the_hooks_that_client_tensors_need(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    import shutil

    bundle_dir = tmp_path / "echo"
    shutil.copytree(bundles["echo"], bundle_dir)
    (bundle_dir / "model.py").write_text("def preprocess(inputs):\n    return inputs\n")
    assert [str(p) for p in validate_bundle(bundle_dir)] == [
        "model.py: does not define a top-level function postprocess, which the declared "
        "client_outputs need"
    ]
    (bundle_dir / "model.py").write_text("def preprocess(:\n")
    assert [str(p) for p in validate_bundle(bundle_dir)] == [
        "model.py: line 1: syntax error: invalid syntax"
    ]
    (bundle_dir / "model.py").unlink()
    assert len(validate_bundle(bundle_dir)) == 2  # preprocess and postprocess missing
