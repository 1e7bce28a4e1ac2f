"""Shared fixtures: a tiny exported bundle to corrupt, the golden bundle, the digits bundle."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

#: Set to 1 by scripts/test.sh for the serving leg, where every test dependency is installed
#: (the ``serve`` and ``test`` extras, tritonserver included): there a test or module that skips
#: fails instead, so that a broken install cannot pass as a run of skips. The numpy-2 leg may skip.
FAIL_ON_SKIP = os.environ.get("HLOSERVE_FAIL_ON_SKIP") == "1"

# The numpy-2 CI leg has no tritonclient (2.51 pins numpy<2) nor grpcio; these modules import
# them (or gateway modules that do) at the top, so they are not collected there (the serving
# leg runs them; with FAIL_ON_SKIP a missing tritonclient is a collection error instead).
if importlib.util.find_spec("tritonclient") is None and not FAIL_ON_SKIP:
    collect_ignore_glob = [
        "gateway/test_admission.py",
        "gateway/test_aggregate.py",
        "gateway/test_auth.py",
        "gateway/test_control.py",
        "gateway/test_deadline.py",
        "gateway/test_dns_discovery.py",
        "gateway/test_ensemble_gateway.py",
        "gateway/test_ensemble_tritonserver.py",
        "gateway/test_haproxy.py",
        "gateway/test_http_fleet.py",
        "gateway/test_http_tritonserver.py",
        "gateway/test_interceptor.py",
        "gateway/test_model_control.py",
        "gateway/test_model_control_tritonserver.py",
        "gateway/test_proxy.py",
        "gateway/test_routing.py",
        "gateway/test_skew.py",
        "gateway/test_stream.py",
        "gateway/test_streams.py",
        "gateway/test_tritonserver.py",
        "gateway/test_wire.py",
        "node/test_open_repository_api.py",
    ]

#: For tests that write Triton model configs (tritonclient's protos) in modules the numpy-2 leg
#: collects: skipped there; in the serving leg a skip fails (FAIL_ON_SKIP).
needs_tritonclient = pytest.mark.skipif(
    importlib.util.find_spec("tritonclient") is None,
    reason="writes Triton model configs: needs tritonclient (not in the numpy-2 leg)",
)

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


def _skip_reason(longrepr: Any) -> str:
    """The reason of a skip report (``longrepr`` is ``(path, line, "Skipped: reason")``)."""
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"skipped where nothing may skip (HLOSERVE_FAIL_ON_SKIP=1, the serving leg of "
        f"scripts/test.sh: every dependency is installed there): {_skip_reason(report.longrepr)}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if FAIL_ON_SKIP and report.skipped and not hasattr(report, "wasxfail"):
        _fail_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if FAIL_ON_SKIP and report.skipped:  # a module-level importorskip or skip
        _fail_skip(report)
    return report


def tiny_fn(params: dict[str, Any], x: Any) -> Any:
    """y = x @ w + b, s = sum(x): the model every corruption test starts from."""
    return x @ params["w"] + params["b"], x.sum(axis=-1)


TINY_PARAMS = {
    "w": np.arange(12, dtype=np.float32).reshape(4, 3) / 10,
    "b": np.array([0.5, -0.5, 1.0], np.float32),
}


def serving_options(repo: Path, log_file: Path | None = None) -> Any:
    """tritonserver options as ``hloserve serve`` sets them, on free ports, for a repository."""
    import dataclasses

    from hloserve.node.serve_options import ServeOptions, server_options
    from hloserve.ports import free_ports

    http, grpc, metrics = free_ports(3)
    options = ServeOptions(path=repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
    return dataclasses.replace(
        server_options(options, repo), log_file=log_file, startup_timeout_s=180.0
    )


@pytest.fixture(scope="session", autouse=True)
def executable_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One executable cache directory for the session, in every runtime and tritonserver it
    starts (``HLOSERVE_EXECUTABLE_CACHE``): tests never read or fill the user's cache."""
    directory = tmp_path_factory.mktemp("executable_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HLOSERVE_EXECUTABLE_CACHE", str(directory))
        yield directory


@pytest.fixture(scope="module")
def restore_x64() -> Iterator[None]:
    """Give JAX's x64 mode back after a module whose runtime code turns it on for the process."""
    import jax

    previous = jax.config.read("jax_enable_x64")
    yield
    jax.config.update("jax_enable_x64", previous)


@pytest.fixture(scope="session")
def tiny_bundle_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid bundle ``tiny`` (f32 x nk k=4 -> y nj j=3, s n; batch sizes 1 and 4)."""
    from hloserve.export import OutputSpec, TensorSpec, export_bundle

    out = tmp_path_factory.mktemp("src") / "tiny"
    export_bundle(
        tiny_fn,
        TINY_PARAMS,
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
        [OutputSpec("y", "nj"), OutputSpec("s", "n")],
        [1, 4],
        out,
    )
    return out


@pytest.fixture
def tiny_bundle(tiny_bundle_src: Path, tmp_path: Path) -> Path:
    """A fresh, writable copy of the tiny bundle for one test to corrupt."""
    dst = tmp_path / "tiny"
    shutil.copytree(tiny_bundle_src, dst)
    return dst


@pytest.fixture
def edit_manifest() -> Callable[[Path, Callable[[dict[str, Any]], None]], None]:
    """Apply an in-place edit to a bundle's manifest.yaml (loaded as plain YAML)."""

    def edit(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
        path = bundle / "manifest.yaml"
        data = yaml.safe_load(path.read_text())
        change(data)
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    return edit


BIG_ITEMS = 5 * 1024 * 1024  # f32 items of the "big" bundle: 20 MiB per request and response


def serving_bundles(bundles: Path, digits_bundle: Path) -> Path:
    """Fill ``bundles`` with digits, the golden affine and "big" (y = 2x, (1, BIG_ITEMS) f32).

    Returns:
        ``bundles``, created.
    """
    bundles.mkdir(parents=True)
    shutil.copytree(digits_bundle, bundles / "digits")
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    export_wide(bundles / "big", BIG_ITEMS, lambda x: x * 2.0)
    return bundles


def export_wide(out: Path, items: int, fn: Callable[[Any], Any]) -> Path:
    """An elementwise bundle at ``out``: ``y = fn(x)``, both (1, ``items``) f32, batch size 1.

    The large-tensor tests' bundle (20 MiB and more per request and response).

    Returns:
        ``out``.
    """
    from hloserve.export import OutputSpec, TensorSpec, export_bundle

    export_bundle(
        lambda p, x: fn(x),
        {},
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": items})],
        [OutputSpec("y", "nk")],
        [1],
        out,
    )
    return out


def import_example(example: str, module: str) -> Any:
    """``examples/<example>/<module>.py``, imported once as ``<example>_<module>``.

    Several examples have a module of the same name (``export.py``); a unique module name keeps
    one from shadowing another in ``sys.modules``. The example's folder is on ``sys.path`` while
    the module runs, so its own sibling imports work; ``sys.path`` is restored afterwards.
    """
    return _import_script(ROOT / "examples" / example / f"{module}.py", f"{example}_{module}")


def import_benchmark(script: str) -> Any:
    """``benchmarks/<script>.py``, imported once as ``benchmark_<script>`` (its folder on
    ``sys.path`` while it runs, as for :func:`import_example`)."""
    return _import_script(ROOT / "benchmarks" / f"{script}.py", f"benchmark_{script}")


def _import_script(path: Path, name: str) -> Any:
    """The module at ``path`` as ``sys.modules[name]`` (dataclasses look their module up there)."""
    if name in sys.modules:
        return sys.modules[name]
    folder = path.parent
    saved = list(sys.path)
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        try:
            spec.loader.exec_module(loaded)
        except BaseException:
            del sys.modules[name]
            raise
        return loaded
    finally:
        sys.path[:] = saved


@pytest.fixture(scope="session")
def digits_model() -> Any:
    """The example's model module (examples/digits/digits_model.py)."""
    return import_example("digits", "digits_model")


@pytest.fixture(scope="session")
def digits_params(digits_model: Any) -> Any:
    """Trained digits params (fixed seed; ~8 s on 2 cores)."""
    return digits_model.train()


def _export_digits(digits_model: Any, digits_params: Any, batch_sizes: Any, out: Path) -> Path:
    """The digits bundle at ``out``, exported the way examples/digits/export.py does it."""
    digits_export = import_example("digits", "export")
    from hloserve.export import export_bundle

    export_bundle(
        digits_model.apply,
        digits_params,
        [digits_export.IMAGE],
        [digits_export.LOGITS],
        digits_export.BATCH_SIZES if batch_sizes is None else batch_sizes,
        out,
    )
    return out


@pytest.fixture(scope="session")
def digits_bundle(
    digits_model: Any, digits_params: Any, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The digits bundle exported the way examples/digits/export.py does it."""
    out = tmp_path_factory.mktemp("bundles") / "digits"
    return _export_digits(digits_model, digits_params, None, out)


@pytest.fixture(scope="session")
def symbolic_digits(
    digits_model: Any, digits_params: Any, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """digits exported with batch_sizes='symbolic' (same params as the fixed digits bundle)."""
    out = tmp_path_factory.mktemp("symbolic") / "digits"
    return _export_digits(digits_model, digits_params, "symbolic", out)
