"""--scheduling and --model-weight: written to the runtime's config, read back by the runtime.

docs/scheduling.md, "Settings".
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("tritonclient.grpc.model_config_pb2")  # absent from the numpy-2 leg

from hloserve import names
from hloserve.cli import main
from hloserve.errors import InvalidArgumentError, Status
from hloserve.model_repository_tools.build_options import SchedulingOptions
from hloserve.model_repository_tools.repository_plan import plan_repository
from hloserve.model_repository_tools.validate import validate_repository
from hloserve.node.serve_options import check_options
from hloserve.ports import free_ports
from hloserve.triton_backend.runtime.scheduler import SchedulerConfig
from tests.node.test_serve_options import _cli_serve_options, write_config

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.fixture
def bundles(tiny_bundle: Path, tmp_path: Path) -> Path:
    root = tmp_path / "bundles"
    root.mkdir()
    shutil.copytree(GOLDEN / "affine", root / "affine")
    shutil.move(tiny_bundle, root / "tiny")
    return root


def runtime_parameters(repo: Path) -> dict[str, str]:
    from hloserve.model_repository_tools.config import parse_config

    config = parse_config(repo / names.RUNTIME_MODEL / "config.pbtxt")
    return {k: v.string_value for k, v in config.parameters.items()}


def test_repo_build_writes_the_scheduler_settings_the_runtime_reads(
    bundles: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(bundles), "-o", str(repo), "--scheduling", "edf"]
    argv += ["--model-weight", "affine=3", "--model-weight", "tiny=0.5"]
    assert main(argv) == 0
    params = runtime_parameters(repo)
    assert params[names.PARAM_SCHEDULING] == "edf"
    assert params[names.PARAM_MODEL_WEIGHTS] == "affine=3.0,tiny=0.5"
    config = SchedulerConfig.from_parameters(params)
    assert (config.discipline, dict(config.weights)) == ("edf", {"affine": 3.0, "tiny": 0.5})
    assert validate_repository(repo) == []
    # the validator keeps the settings, but checks them
    path = repo / names.RUNTIME_MODEL / "config.pbtxt"
    path.write_text(path.read_text().replace('"affine=3.0,tiny=0.5"', '"affine=-3"'))
    problems = validate_repository(repo)
    assert len(problems) == 1 and "'affine'" in problems[0].message, problems


def test_default_build_writes_no_scheduler_parameters_and_reads_as_fair(bundles: Path) -> None:
    from hloserve.model_repository_tools.config import parse_config_text

    config = parse_config_text(plan_repository(bundles).runtime_config_text)
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert names.PARAM_SCHEDULING not in params and names.PARAM_MODEL_WEIGHTS not in params
    assert SchedulerConfig.from_parameters(params) == SchedulerConfig()
    fair = plan_repository(bundles, scheduling=SchedulingOptions(model_weights={"tiny": 1.0}))
    assert names.PARAM_MODEL_WEIGHTS not in fair.runtime_config_text  # 1.0 is the default


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--model-weight", "nosuch=2"], "'nosuch', which is not a model the runtime serves"),
        (["--model-weight", "tiny=0"], "weight of model 'tiny' is '0', not a number > 0"),
        (["--model-weight", "tiny=-1"], "not a number > 0"),
        (["--model-weight", "tiny=heavy"], "not a number > 0"),
        (["--model-weight", "tiny"], "'<model>=<weight>'"),
        (["--model-weight", "tiny=2", "--model-weight", "tiny=3"], "twice"),
    ],
)
def test_bad_model_weights_are_refused(
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


def test_unknown_discipline_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["repo", "build", "b", "-o", "r", "--scheduling", "lifo"])
    assert "invalid choice: 'lifo'" in capsys.readouterr().err
    with pytest.raises(InvalidArgumentError, match="'lifo' is not one of"):
        from hloserve.model_repository_tools.config import check_scheduling_options

        check_scheduling_options(["m"], "lifo", {})


def test_serve_passes_scheduling_to_the_build_and_refuses_it_on_a_built_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, "hloserve_runtime")
    ports = [str(p) for p in free_ports(3)]
    argv = [str(tmp_path), "--http-port", ports[0], "--grpc-port", ports[1]]
    argv += ["--metrics-port", ports[2]]
    options = _cli_serve_options(monkeypatch, argv)
    assert options.build.scheduling == SchedulingOptions()
    check_options(options)
    for flags, named in (
        (["--scheduling", "fifo"], "--scheduling applies"),
        (["--model-weight", "a=2"], "--model-weight applies"),
    ):
        with pytest.raises(InvalidArgumentError, match=named) as info:
            check_options(_cli_serve_options(monkeypatch, [*argv, *flags]))
        assert info.value.status is Status.INVALID_ARGUMENT
    bundles = tmp_path / "bundles"
    (bundles / "m").mkdir(parents=True)
    options = _cli_serve_options(
        monkeypatch, [str(bundles), *argv[1:], "--scheduling", "edf", "--model-weight", "m=2"]
    )
    assert options.build.scheduling == SchedulingOptions(scheduling="edf", model_weights={"m": 2.0})
    check_options(options)
