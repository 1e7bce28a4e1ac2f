"""``--executable-cache`` / ``--executable-cache-bytes`` on ``repo build`` and ``serve``: what the
runtime config gets (``hloserve.executable_cache``, ``hloserve.executable_cache_bytes``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("tritonclient.grpc.model_config_pb2")

from hloserve import cli, names
from hloserve.cli import main
from hloserve.model_repository_tools.build_options import ExecutableCacheOptions
from hloserve.model_repository_tools.config import parse_config
from hloserve.model_repository_tools.validate import validate_repository
from hloserve.node import serve, serve_options
from tests.conftest import GOLDEN


@pytest.fixture
def bundles(tmp_path: Path) -> Path:
    shutil.copytree(GOLDEN / "affine", tmp_path / "bundles" / "affine")
    return tmp_path / "bundles"


def runtime_parameters(repo: Path) -> dict[str, str]:
    config = parse_config(repo / names.RUNTIME_MODEL / "config.pbtxt")
    return {k: v.string_value for k, v in config.parameters.items()}


def test_build_writes_an_absolute_directory_and_the_bound(
    bundles: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(bundles), "-o", str(repo)]
    assert main([*argv, "--executable-cache", "cache", "--executable-cache-bytes", "1000"]) == 0
    params = runtime_parameters(repo)
    assert params[names.PARAM_EXECUTABLE_CACHE] == str(tmp_path / "cache")
    assert params[names.PARAM_EXECUTABLE_CACHE_BYTES] == "1000"
    assert validate_repository(repo) == []  # the validator keeps them ...
    path = repo / names.RUNTIME_MODEL / "config.pbtxt"
    path.write_text(path.read_text().replace('"1000"', '"lots"'))
    problems = validate_repository(repo)  # ... but checks them
    assert len(problems) == 1 and "'lots'" in problems[0].message, problems


def test_off_and_the_default(bundles: Path, tmp_path: Path) -> None:
    off, default = tmp_path / "off", tmp_path / "default"
    assert main(["repo", "build", str(bundles), "-o", str(off), "--executable-cache", "OFF"]) == 0
    assert runtime_parameters(off)[names.PARAM_EXECUTABLE_CACHE] == "off"
    assert main(["repo", "build", str(bundles), "-o", str(default)]) == 0
    params = runtime_parameters(default)  # the runtime picks the environment or the default
    assert names.PARAM_EXECUTABLE_CACHE not in params
    assert names.PARAM_EXECUTABLE_CACHE_BYTES not in params


def test_a_negative_bound_is_refused(
    bundles: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(bundles), "-o", str(repo), "--executable-cache-bytes", "-1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "--executable-cache-bytes must be >= 0" in err, err
    assert not repo.exists()


def test_serve_passes_the_options_to_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    captured: list[serve_options.ServeOptions] = []
    monkeypatch.setattr(serve, "run_serve", lambda options: captured.append(options) or 0)
    argv = ["serve", str(tmp_path), "--executable-cache", str(tmp_path / "x")]
    args = cli.build_parser().parse_args([*argv, "--executable-cache-bytes", "77"])
    args.func(args)
    assert captured[0].build.executable_cache == ExecutableCacheOptions(
        directory=str(tmp_path / "x"), max_bytes=77
    )
    assert serve_options.build_flags_set(captured[0]) == [
        "--executable-cache",
        "--executable-cache-bytes",
    ]
