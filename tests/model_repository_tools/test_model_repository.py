"""The repository generator: config.pbtxt text (golden), determinism, atomic writes, refusals.

Golden configs: ``tests/golden/repository/{affine,hloserve_runtime}.config.pbtxt`` are what
``hloserve repo build`` writes for the checked-in golden bundle ``tests/golden/affine/``.
Regenerate them on purpose (a contract change in docs/serving.md) with

    HLOSERVE_REGEN_GOLDEN=1 python -m pytest \
        tests/model_repository_tools/test_model_repository.py -k golden

and review the diff.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tritonclient.grpc.model_config_pb2")

from hloserve import names
from hloserve.bundle.manifest import parse_manifest
from hloserve.cli import main
from hloserve.errors import BundleError, RepositoryError, Status
from hloserve.model_repository_tools import build as build_module
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.build_options import (
    BuildOptions,
    QueueOptions,
    WeightCacheOptions,
)
from hloserve.model_repository_tools.config import (
    front_config,
    parse_config,
    parse_config_text,
    pb2,
)
from hloserve.model_repository_tools.repository_plan import check_names, plan_repository
from hloserve.model_repository_tools.validate import validate_repository

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GOLDEN_REPO = GOLDEN / "repository"
REGEN = os.environ.get("HLOSERVE_REGEN_GOLDEN") == "1"
KIND_CPU = pb2().ModelInstanceGroup.KIND_CPU

Edit = Callable[[Path, Callable[[dict[str, Any]], None]], None]


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes; directories as b"<dir>"."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        out[rel] = b"<dir>" if path.is_dir() else path.read_bytes()
    return out


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for rel, data in _tree(root).items():
        h.update(rel.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def _siblings(out: Path) -> list[str]:
    """Leftover temporary directories beside ``out``."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f"{out.name}."))


@pytest.fixture
def bundles(tiny_bundle: Path, tmp_path: Path) -> Path:
    """A bundles directory holding the golden ``affine`` bundle and a writable ``tiny``."""
    root = tmp_path / "bundles"
    root.mkdir()
    shutil.copytree(GOLDEN / "affine", root / "affine")
    shutil.move(tiny_bundle, root / "tiny")
    return root


@pytest.fixture(scope="module")
def odd_bundles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Bundles with a non-leading batch axis (``nonlead``) and without one (``unbatched``)."""
    from hloserve.export import OutputSpec, TensorSpec, export_bundle
    from tests.conftest import TINY_PARAMS

    root = tmp_path_factory.mktemp("odd")
    export_bundle(
        lambda p, x: (x.T @ p["w"] + p["b"], x.sum(axis=0)),
        TINY_PARAMS,
        [TensorSpec(name="x", dtype="f32", shape="kn", dims={"k": 4})],
        [OutputSpec("y", "nj"), OutputSpec("s", "n")],
        [1, 4],
        root / "nonlead",
    )
    export_bundle(
        lambda p, x: x @ p["w"] + p["b"],
        TINY_PARAMS,
        [TensorSpec(name="x", dtype="f32", shape="k", dims={"k": 4})],
        [OutputSpec("y", "j")],
        [],
        root / "unbatched",
    )
    return root


# -- golden text ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["affine", names.RUNTIME_MODEL])
def test_golden_config_text(model: str, tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    repo = tmp_path / "repo"
    build_repository(bundles, repo)
    text = (repo / model / "config.pbtxt").read_text()
    golden = GOLDEN_REPO / f"{model}.config.pbtxt"
    if REGEN:
        GOLDEN_REPO.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs; see this file's docstring"


def test_golden_configs_parse_back(tmp_path: Path) -> None:
    front = parse_config(GOLDEN_REPO / "affine.config.pbtxt")
    assert front.name == "affine"
    assert front.backend == names.FRONT_BACKEND
    assert front.max_batch_size == 2
    assert [(i.name, list(i.dims)) for i in front.input] == [("x", [4])]
    assert [(o.name, list(o.dims), o.HasField("reshape")) for o in front.output] == [
        ("y", [3], False),
        ("label", [1], True),  # per-item scalar: dims [1] + empty reshape
    ]
    assert list(front.dynamic_batching.preferred_batch_size) == [1, 2]
    assert front.dynamic_batching.max_queue_delay_microseconds == 500
    assert [(g.count, g.kind) for g in front.instance_group] == [(2, KIND_CPU)]
    assert {k: v.string_value for k, v in front.parameters.items()} == {
        names.PARAM_BUNDLE: "1/bundle",
        names.PARAM_RUNTIME_MODEL: names.RUNTIME_MODEL,
        names.PARAM_REPOSITORY_FORMAT: str(names.REPOSITORY_FORMAT),
        names.PARAM_MAX_REQUEST_BYTES: str(names.DEFAULT_MAX_REQUEST_BYTES),
    }
    assert len(front.model_warmup) == 0  # the front has the runtime compile instead (config.py)
    runtime = parse_config(GOLDEN_REPO / "hloserve_runtime.config.pbtxt")
    assert runtime.max_batch_size == 0
    assert list(runtime.input) == [] and list(runtime.output) == []  # fronts use the channel
    assert [(g.count, g.kind) for g in runtime.instance_group] == [(1, KIND_CPU)]
    assert names.PARAM_BUNDLES not in runtime.parameters  # fronts load their own bundles


# -- layout, options, determinism ----------------------------------------------------------------


def test_layout_and_options(bundles: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    plan = build_repository(bundles, repo, front_instances=3, max_queue_delay_us=100)
    assert [m.name for m in plan.models] == ["affine", "tiny"] and plan.foreign == ()
    assert sorted(p.name for p in repo.iterdir()) == ["affine", names.RUNTIME_MODEL, "tiny"]
    assert sorted(p.name for p in (repo / "tiny" / "1" / "bundle").iterdir()) == sorted(
        p.name for p in (bundles / "tiny").iterdir()
    )
    assert list((repo / names.RUNTIME_MODEL / "1").iterdir()) == []
    tiny = parse_config(repo / "tiny" / "config.pbtxt")
    assert tiny.max_batch_size == 4
    assert tiny.instance_group[0].count == 3
    assert tiny.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(tiny.dynamic_batching.preferred_batch_size) == [1, 4]
    runtime = parse_config(repo / names.RUNTIME_MODEL / "config.pbtxt")
    assert names.PARAM_BUNDLES not in runtime.parameters
    assert _siblings(repo) == []
    assert validate_repository(repo) == []


def test_two_builds_are_byte_identical(bundles: Path, tmp_path: Path) -> None:
    build_repository(bundles, tmp_path / "one")
    build_repository(bundles, tmp_path / "two")
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two")


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"front_instances": -1}, "front instances must be >= 0"),
        ({"max_queue_delay_us": -1}, "max queue delay must be >= 0"),
    ],
)
def test_bad_options_are_refused(
    bundles: Path, tmp_path: Path, kwargs: dict[str, int], text: str
) -> None:
    with pytest.raises(RepositoryError, match=text):
        build_repository(bundles, tmp_path / "repo", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "repo").exists()


def test_empty_bundles_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="no bundles"):
        build_repository(tmp_path, tmp_path / "repo")


# -- batching rules ------------------------------------------------------------------------------


def test_non_leading_batch_axis_gets_max_batch_size_0(odd_bundles: Path) -> None:
    plan = plan_repository(odd_bundles)
    [nonlead] = [m for m in plan.models if m.name == "nonlead"]
    config = parse_config_text(nonlead.config_text)
    assert config.max_batch_size == 0
    # a dynamic_batching block for the default queue bound alone (no preferred sizes)
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 128
    assert not config.dynamic_batching.preferred_batch_size
    assert [(i.name, list(i.dims)) for i in config.input] == [("x", [4, -1])]
    assert [(o.name, list(o.dims), o.HasField("reshape")) for o in config.output] == [
        ("y", [-1, 3], False),
        ("s", [-1], False),
    ]


def test_unbatched_model(odd_bundles: Path) -> None:
    plan = plan_repository(odd_bundles)
    [unbatched] = [m for m in plan.models if m.name == "unbatched"]
    config = parse_config_text(unbatched.config_text)
    assert config.max_batch_size == 0
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 128  # the default
    bounded = plan_repository(odd_bundles, queue=QueueOptions(max_queue_size=5))
    [unbatched] = [m for m in bounded.models if m.name == "unbatched"]
    bounded_config = parse_config_text(unbatched.config_text)
    assert [g.count for g in bounded_config.instance_group] == [2]
    policy = bounded_config.dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.allow_timeout_override) == (5, True)
    assert [(i.name, list(i.dims)) for i in config.input] == [("x", [4])]
    runtime = parse_config_text(plan.runtime_config_text)
    assert list(runtime.input) == []  # the runtime declares no tensors (repository format 2)


def test_scalar_of_unbatched_model_is_refused() -> None:
    manifest = parse_manifest(
        {
            "format_version": 1,
            "inputs": [{"name": "x", "dtype": "f32", "shape": "k", "dims": {"k": 4}}],
            "outputs": [{"name": "total", "dtype": "f32", "shape": ""}],
            "executables": {0: "model.mlirbc"},
        }
    )
    with pytest.raises(Exception, match="tensor 'total' is a scalar") as info:
        front_config("m", manifest, BuildOptions(max_queue_delay_us=0))
    assert info.value.status is Status.UNIMPLEMENTED  # type: ignore[attr-defined]
    assert "model 'm'" in str(info.value)


# -- refusals: invalid bundles, names ------------------------------------------------------------


def test_invalid_bundle_writes_nothing(bundles: Path, tmp_path: Path, edit_manifest: Edit) -> None:
    edit_manifest(bundles / "tiny", lambda d: d["inputs"][0]["dims"].update({"k": 5}))
    repo = tmp_path / "repo"
    lines: list[str] = []
    with pytest.raises(BundleError) as info:
        build_repository(bundles, repo, progress=lines.append)
    message = str(info.value)
    assert "bundle 'tiny'" in message
    assert "input 'x': shape [1, 5] in manifest, [1, 4] in the artifact" in message
    assert lines[0].startswith("affine: valid")
    assert lines[1] == "tiny: INVALID (2 problem(s))"
    assert not repo.exists()
    assert _siblings(repo) == []


def test_cli_invalid_bundle(
    bundles: Path, tmp_path: Path, edit_manifest: Edit, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_manifest(bundles / "tiny", lambda d: d["outputs"][0].update({"dtype": "i32"}))
    repo = tmp_path / "repo"
    assert main(["repo", "build", str(bundles), "-o", str(repo)]) == 1
    err = capsys.readouterr().err
    assert "error (INVALID_ARGUMENT): bundle 'tiny'" in err
    assert "output 'y': dtype i32 in manifest, f32 in the artifact" in err
    assert not repo.exists()
    assert _siblings(repo) == []


def test_runtime_name_collision_is_refused(bundles: Path, tmp_path: Path) -> None:
    shutil.copytree(bundles / "tiny", bundles / "tiny__v2")
    with pytest.raises(RepositoryError) as info:
        build_repository(bundles, tmp_path / "repo")
    message = str(info.value)
    assert "runtime tensor name 'tiny__v2__x' is ambiguous" in message
    assert "tensor 'x' of model 'tiny__v2' and reads as tensor 'v2__x' of model 'tiny'" in message
    assert not (tmp_path / "repo").exists()


def test_exact_runtime_name_collision_is_refused(bundles: Path, tmp_path: Path) -> None:
    # "a_" + "__" + "x" == "a" + "__" + "_x": a bundle "a_" beside a bundle "a" with tensor "_x"
    root = tmp_path / "two"
    root.mkdir()
    shutil.copytree(bundles / "tiny", root / "a_")
    shutil.copytree(bundles / "tiny", root / "a")
    from hloserve.bundle.bundle import load_bundle

    with pytest.raises(RepositoryError, match="'a___x' is ambiguous"):
        check_names([load_bundle(root / "a"), load_bundle(root / "a_")])


def test_bundle_named_like_the_runtime_is_refused(bundles: Path, tmp_path: Path) -> None:
    shutil.move(bundles / "tiny", bundles / names.RUNTIME_MODEL)
    with pytest.raises(RepositoryError, match="has the runtime model's name"):
        build_repository(bundles, tmp_path / "repo")


def test_runtime_tensor_names() -> None:
    assert names.runtime_tensor_name("digits", "image") == "digits__image"


# -- copies and conversion -----------------------------------------------------------------------


def test_text_executables_converted_in_copy_only(
    bundles: Path, tmp_path: Path, edit_manifest: Edit
) -> None:
    from hloserve.bundle.stablehlo import is_portable_artifact, module_text

    src = bundles / "tiny"
    text = module_text((src / "model.b1.mlirbc").read_bytes())
    (src / "model.b1.mlir").write_text(text)
    (src / "model.b1.mlirbc").unlink()
    edit_manifest(src, lambda d: d["executables"].update({1: "model.b1.mlir"}))
    before = _digest(src)
    repo = tmp_path / "repo"
    lines: list[str] = []
    plan = build_repository(bundles, repo, progress=lines.append)
    assert _digest(src) == before, "the source bundle was modified"
    assert [m.text_executables for m in plan.models] == [(), ("model.b1.mlir",)]
    assert "tiny: copied to tiny/1/bundle; converted model.b1.mlir to portable artifacts" in lines
    copy = repo / "tiny" / "1" / "bundle"
    assert not (copy / "model.b1.mlir").exists()
    assert is_portable_artifact((copy / "model.b1.mlirbc").read_bytes())
    assert "model.b1.mlirbc" in (copy / "manifest.yaml").read_text()
    assert validate_repository(repo) == []


def test_dot_files_are_not_copied(bundles: Path, tmp_path: Path) -> None:
    (bundles / "tiny" / ".manifest.yaml.swp").write_text("editor junk")
    build_repository(bundles, tmp_path / "repo")
    assert not (tmp_path / "repo" / "tiny" / "1" / "bundle" / ".manifest.yaml.swp").exists()


# -- atomic writes -------------------------------------------------------------------------------


def test_existing_repository_needs_overwrite(bundles: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build_repository(bundles, repo)
    before = _digest(repo)
    with pytest.raises(
        RepositoryError, match="exists; to replace it, build with overwrite on "
    ) as info:
        build_repository(bundles, repo, front_instances=5)
    assert info.value.status is Status.FAILED_PRECONDITION
    assert "overwrite=True" not in str(info.value)  # no Python argument in a CLI message
    assert _digest(repo) == before


def test_overwrite_never_replaces_a_directory_hloserve_did_not_build(
    bundles: Path, tmp_path: Path
) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(RepositoryError, match="is not a repository hloserve built") as info:
        build_repository(bundles, precious, overwrite=True)
    assert info.value.status is Status.FAILED_PRECONDITION
    assert (precious / "notes.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    build_repository(bundles, empty, overwrite=True)  # an empty directory is fine
    build_repository(bundles, empty, overwrite=True)  # and so is its own repository
    assert (empty / names.RUNTIME_MODEL / "config.pbtxt").is_file()


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_overwrite_replaces_whole_repository(
    bundles: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:
        monkeypatch.setattr(build_module, "_exchange", lambda a, b: False)
    repo = tmp_path / "repo"
    build_repository(bundles, repo)
    (repo / "stale_model").mkdir()
    shutil.rmtree(bundles / "affine")
    build_repository(bundles, repo, front_instances=5, overwrite=True)
    assert sorted(p.name for p in repo.iterdir()) == [names.RUNTIME_MODEL, "tiny"]
    assert parse_config(repo / "tiny" / "config.pbtxt").instance_group[0].count == 5
    assert _siblings(repo) == []


def test_failed_write_leaves_old_repository(
    bundles: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    build_repository(bundles, repo)
    before = _digest(repo)

    def broken_copy(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(build_module.shutil, "copytree", broken_copy)
    with pytest.raises(OSError, match="No space left"):
        build_repository(bundles, repo, overwrite=True)
    assert _digest(repo) == before
    assert _siblings(repo) == []


def test_readers_never_see_a_partial_repository(bundles: Path, tmp_path: Path) -> None:
    """A poller reading configs during repeated overwrites always finds a whole file."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    if not build_module._exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    repo = tmp_path / "repo"
    queue = QueueOptions(max_queue_size=128)  # the same bound on one instance and on two
    build_repository(bundles, repo, front_instances=1, queue=queue)
    expected = {
        n: (repo / "tiny" / "config.pbtxt").read_text().replace("count: 1", f"count: {n}")
        for n in (1, 2)
    }
    seen: list[str] = []
    failures: list[str] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set() and len(seen) < 100_000:
            try:
                seen.append((repo / "tiny" / "config.pbtxt").read_text())
                (repo / names.RUNTIME_MODEL / "config.pbtxt").read_text()
            except OSError as exc:
                failures.append(repr(exc))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for i in range(6):
            build_repository(bundles, repo, front_instances=1 + i % 2, queue=queue, overwrite=True)
    finally:
        done.set()
        poller.join(timeout=30)
    assert failures == []
    assert seen and set(seen) <= set(expected.values())


def test_repository_may_not_hold_the_bundles(bundles: Path) -> None:
    with pytest.raises(RepositoryError, match="holds the bundle"):
        build_repository(bundles, bundles, overwrite=True)
    assert (bundles / "tiny" / "manifest.yaml").is_file()


# -- validate and CLI ----------------------------------------------------------------------------


def test_validate_finds_edits_and_missing_pieces(bundles: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build_repository(bundles, repo)
    config = repo / "tiny" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 4", "max_batch_size: 8"))
    (repo / "affine" / "1" / "bundle" / "model.b2.mlirbc").unlink()
    shutil.rmtree(repo / names.RUNTIME_MODEL)
    problems = [str(p) for p in validate_repository(repo)]
    assert any(
        p.startswith("tiny/config.pbtxt: does not match") and "max_batch_size: 8" in p
        for p in problems
    ), problems
    assert "affine/1/bundle/model.b2.mlirbc: artifact for batch size 2 is missing" in problems
    assert "hloserve_runtime/config.pbtxt: the runtime model is missing" in problems


def test_cli_build_and_validate(
    bundles: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(bundles), "-o", str(repo), "--front-instances", "3"]
    assert main([*argv, "--max-queue-delay-us", "250", "--max-request-bytes", "4096"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "affine: valid (1 input(s), 2 output(s), batch sizes 1, 2)"
    assert "tiny: copied to tiny/1/bundle" in out
    assert out[-1] == f"{repo}: wrote 2 front model(s) and the runtime model"
    tiny = parse_config(repo / "tiny" / "config.pbtxt")
    assert tiny.instance_group[0].count == 3
    assert tiny.dynamic_batching.max_queue_delay_microseconds == 250
    assert tiny.parameters[names.PARAM_MAX_REQUEST_BYTES].string_value == "4096"
    assert main(["repo", "validate", str(repo)]) == 0
    assert capsys.readouterr().out.strip() == f"{repo}: valid"
    assert main(argv) == 1  # exists, no --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    (repo / "tiny" / "config.pbtxt").write_text("name: [")
    capsys.readouterr()
    assert main(["repo", "validate", str(repo)]) == 1
    assert "repo/tiny/config.pbtxt: " in capsys.readouterr().err


# -- weight cache settings (docs/on_demand_weights.md) ------------------------------------------


def test_golden_runtime_config_with_weight_cache_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(bundles), "-o", str(repo), "--weight-cache-bytes", "1048576"]
    argv += ["--residency", "affine=device", "--compaction-interval", "8"]
    assert main(argv) == 0
    text = (repo / names.RUNTIME_MODEL / "config.pbtxt").read_text()
    golden = GOLDEN_REPO / "hloserve_runtime.weight_cache.config.pbtxt"
    if REGEN:
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs; see this file's docstring"
    config = parse_config_text(text)
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params[names.PARAM_WEIGHT_CACHE_BYTES] == "1048576"
    assert params[names.PARAM_RESIDENCY] == "affine=device"
    assert params[names.PARAM_COMPACTION_INTERVAL] == "8"
    assert validate_repository(repo) == []
    # the validator keeps the settings a repository was built with, but checks them
    path = repo / names.RUNTIME_MODEL / "config.pbtxt"
    path.write_text(text.replace('"affine=device"', '"affine=gpu"'))
    problems = validate_repository(repo)
    assert len(problems) == 1 and "'gpu'" in problems[0].message, problems


def test_default_build_writes_no_weight_cache_parameters(bundles: Path, tmp_path: Path) -> None:
    plan = plan_repository(bundles)
    config = parse_config_text(plan.runtime_config_text)
    for key in (
        names.PARAM_WEIGHT_CACHE_BYTES,
        names.PARAM_RESIDENCY,
        names.PARAM_COMPACTION_INTERVAL,
    ):
        assert key not in config.parameters


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--residency", "nosuch=device"], "'nosuch'"),
        (["--residency", "tiny=gpu"], "'gpu'"),
        (["--residency", "tiny"], "'<model>=<residency>'"),
        (["--residency", "tiny=device", "--residency", "tiny=unpinned"], "twice"),
        (["--weight-cache-bytes", "-1"], ">= 0"),
        (["--compaction-interval", "-2"], ">= 0"),
        (["--weight-cache-fraction", "1.5"], "(0, 1]"),
        (["--weight-cache-fraction", "0.5", "--weight-cache-bytes", "9"], "not both"),
    ],
)
def test_bad_weight_cache_options_are_refused(
    bundles: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    needle: str,
) -> None:
    repo = tmp_path / "repo"
    assert main(["repo", "build", str(bundles), "-o", str(repo), *options]) == 1
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and needle in err, err
    assert not repo.exists()


@pytest.mark.parametrize(
    ("budget", "residency", "needles"),
    [  # affine and tiny: 60 bytes of weights each
        (
            "59",
            [],
            ["weights of model 'affine' are 60 bytes", "'tiny' are 60 bytes", "of 59 bytes"],
        ),
        (
            "50",
            ["affine=device"],
            ["model 'affine' (residency=device) are 60 bytes", "of 50 bytes"],
        ),
        (
            "100",
            ["affine=device", "tiny=device"],
            ["models ('affine' 60 bytes, 'tiny' 60 bytes) total 120 bytes", "of 100 bytes"],
        ),
        (
            "100",
            ["affine=device"],
            [
                "model 'tiny' are 60 bytes",
                "more than the 40 bytes the residency=device models "
                "leave of the weight cache budget of 100 bytes (they pin 60 bytes)",
            ],
        ),
        (
            "50",
            ["affine=device"],
            [
                "model 'tiny' are 60 bytes, more than the 0 bytes the residency=device models "
                "leave of the weight cache budget of 50 bytes (they pin 60 bytes)"
            ],
        ),
    ],
)
def test_build_refuses_a_weight_budget_a_model_can_never_fit(
    bundles: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    budget: str,
    residency: list[str],
    needles: list[str],
) -> None:
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(bundles), "-o", str(repo), "--weight-cache-bytes", budget]
    argv += [arg for r in residency for arg in ("--residency", r)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "raise the weight cache budget" in err, err
    for needle in needles:
        assert needle in err, err
    assert not repo.exists()


def test_build_accepts_a_weight_budget_every_model_fits(bundles: Path, tmp_path: Path) -> None:
    # the budget is the rule's edge: both pinned (120 bytes), or one pinned + the other on demand;
    # each is built, and the runtime's config.pbtxt carries the budget and residency as given
    cases = [
        (120, {"affine": "device", "tiny": "device"}, "affine=device,tiny=device"),
        (120, {"affine": "device"}, "affine=device"),
        (60, {}, ""),
    ]
    for i, (budget, residency, text) in enumerate(cases):
        cache = WeightCacheOptions(weight_cache_bytes=budget, residency=residency)
        plan = plan_repository(bundles, weight_cache=cache)
        repo = tmp_path / f"repo{i}"
        build_repository(bundles, repo, weight_cache=cache)
        written = (repo / names.RUNTIME_MODEL / "config.pbtxt").read_text()
        assert written == plan.runtime_config_text
        config = parse_config(repo / names.RUNTIME_MODEL / "config.pbtxt")
        params = {k: v.string_value for k, v in config.parameters.items()}
        assert params[names.PARAM_WEIGHT_CACHE_BYTES] == str(budget), params
        assert params.get(names.PARAM_RESIDENCY, "") == text, params
        assert names.PARAM_WEIGHT_CACHE_FRACTION not in params, params


def test_residency_text_round_trips() -> None:
    text = names.format_residency({"b": "unpinned", "a": "device", "c": "system"})
    assert text == "a=device,b=unpinned"  # sorted, default left out
    assert names.parse_residency(text) == {"a": "device", "b": "unpinned"}
    assert names.parse_residency(" a = Device , ") == {"a": "device"}
    assert names.parse_residency("") == {}


def test_serve_builds_with_weight_cache_options(bundles: Path) -> None:

    from hloserve.node.serve import prepared_repository
    from hloserve.node.serve_options import ServeOptions

    cache = WeightCacheOptions(weight_cache_bytes=4096, residency={"tiny": "unpinned"})
    options = ServeOptions(path=bundles, build=BuildOptions(weight_cache=cache))
    with prepared_repository(options) as repo:
        config = parse_config(repo / names.RUNTIME_MODEL / "config.pbtxt")
        params = {k: v.string_value for k, v in config.parameters.items()}
    assert params[names.PARAM_WEIGHT_CACHE_BYTES] == "4096"
    assert params[names.PARAM_RESIDENCY] == "tiny=unpinned"


def test_serve_builds_with_the_request_limit(bundles: Path) -> None:
    from hloserve.node.serve import prepared_repository
    from hloserve.node.serve_options import ServeOptions

    with prepared_repository(
        ServeOptions(path=bundles, build=BuildOptions(max_request_bytes=4096))
    ) as repo:
        tiny = parse_config(repo / "tiny" / "config.pbtxt")
        assert validate_repository(repo) == []
    assert tiny.parameters[names.PARAM_MAX_REQUEST_BYTES].string_value == "4096"


def test_weight_cache_fraction_is_written_and_validated(bundles: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert (
        main(["repo", "build", str(bundles), "-o", str(repo), "--weight-cache-fraction", "0.8"])
        == 0
    )
    config = parse_config(repo / names.RUNTIME_MODEL / "config.pbtxt")
    assert config.parameters[names.PARAM_WEIGHT_CACHE_FRACTION].string_value == "0.8"
    assert names.PARAM_WEIGHT_CACHE_BYTES not in config.parameters
    assert validate_repository(repo) == []


def test_residency_of_a_meta_model_is_refused(
    bundles: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.bundle.test_meta_manifest import write_meta

    write_meta(bundles, "twice", meta={"calls": ["tiny"]})
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(bundles), "-o", str(repo), "--residency", "twice=device"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err, err
    assert "residency for 'twice': 'twice' is a meta model: it has no weights" in err, err
    assert "bundles with weights: ['affine', 'tiny']" in err, err
    assert not repo.exists()
