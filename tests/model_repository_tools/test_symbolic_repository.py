"""Symbolic-batch bundles in a model repository: ``--batch-sizes`` chosen at build time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("tritonclient.grpc.model_config_pb2")

from hloserve.bundle.bundle import load_bundle
from hloserve.errors import RepositoryError
from hloserve.export import OutputSpec, TensorSpec, export_bundle
from hloserve.model_repository_tools.batch_sizes import parse_batch_sizes
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.build_options import BatchSizeOptions


def test_repo_build_chooses_sizes(
    symbolic_digits: Path, digits_bundle: Path, tmp_path: Path
) -> None:
    from hloserve.model_repository_tools.config import parse_config

    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(symbolic_digits, bundles / "sym")
    shutil.copytree(digits_bundle, bundles / "fixed")
    lines: list[str] = []
    build_repository(
        bundles,
        tmp_path / "repo",
        batch_sizes=parse_batch_sizes(["sym=1,8,64"]),
        progress=lines.append,
    )
    assert "sym: symbolic batch, compiles batch sizes [1, 8, 64]" in lines
    copy = load_bundle(tmp_path / "repo" / "sym" / "1" / "bundle", name="sym")
    assert copy.manifest.batching.compiled_batch_sizes == [1, 8, 64]
    config = parse_config(tmp_path / "repo" / "sym" / "config.pbtxt")
    assert config.max_batch_size == 64
    assert list(config.dynamic_batching.preferred_batch_size) == [1, 8, 64]
    assert load_bundle(bundles / "sym").manifest.batching.compiled_batch_sizes == []  # untouched

    build_repository(bundles, tmp_path / "repo2")  # default ladder
    copy = load_bundle(tmp_path / "repo2" / "sym" / "1" / "bundle", name="sym")
    assert copy.manifest.batching.compiled_batch_sizes == [1, 4, 16, 64]

    for options, message in (
        (BatchSizeOptions(per_model={"fixed": (1, 2)}), "'fixed' has fixed compiled batch sizes"),
        (BatchSizeOptions(per_model={"nope": (1,)}), "'nope', which is not among the bundles"),
    ):
        with pytest.raises(RepositoryError, match=message):
            build_repository(bundles, tmp_path / "repo3", batch_sizes=options)
    assert not (tmp_path / "repo3").exists()
    shutil.rmtree(bundles / "sym")
    with pytest.raises(RepositoryError, match="none of \\['fixed'\\] is one"):
        build_repository(bundles, tmp_path / "repo3", batch_sizes=parse_batch_sizes(["1,2"]))


def test_repo_build_refuses_a_size_the_constraints_forbid(tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    export_bundle(
        lambda p, x: x + 1.0,
        {},
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
        [OutputSpec("y", "nk")],
        "symbolic",
        bundles / "bounded",
        batch_max=16,
    )
    with pytest.raises(
        RepositoryError, match=r"'bounded' cannot compile batch size 32: .* b <= 16"
    ):
        build_repository(bundles, tmp_path / "repo", batch_sizes=parse_batch_sizes(["1,32"]))
