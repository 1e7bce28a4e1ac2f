"""The executable disk cache (hloserve.triton_backend.runtime.executable_cache) and its compile
path.

Pure-cache tests use byte payloads; the compile tests serialize real XLA executables of the
golden ``affine`` bundle (JAX 0.7.1 in the serving env, the newest JAX in the numpy-2 env).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.errors import InvalidArgumentError
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend.runtime import executable_cache as xc
from hloserve.triton_backend.runtime.compile import (
    compile_artifact,
    deserialize_executable,
    executable_key,
    serialize_executable,
)
from hloserve.triton_backend.runtime.config import (
    ExecutableCacheSettings,
    cache_settings,
    default_directory,
    executable_cache,
)
from hloserve.triton_backend.runtime.executable_cache import (
    CachedEntry,
    CacheKey,
    ExecutableCache,
    ExecutableLabel,
)
from tests.conftest import GOLDEN, ROOT

pytestmark = pytest.mark.usefixtures("restore_x64")

KEY = CacheKey(
    artifact_sha256="a" * 64,
    platform="cpu",
    platform_version="cpu",
    device_kind="cpu",
    device_id=0,
    jaxlib_version="0.7.1/368",
    compile_options_sha256="c" * 64,
    xla_flags="",
    x64=True,
    variant="",
    batch_size=2,
)
LABEL = ExecutableLabel("affine", "", 2)
AFFINE_B2 = GOLDEN / "affine" / "model.b2.mlirbc"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- key ----------------------------------------------------------------------------------------


def test_key_changes_with_each_component() -> None:
    other: dict[str, Any] = {
        "artifact_sha256": "b" * 64,
        "platform": "cuda",
        "platform_version": "12.6",
        "device_kind": "NVIDIA H200",
        "device_id": 1,
        "jaxlib_version": "0.10.2/467",
        "compile_options_sha256": "d" * 64,
        "xla_flags": "--xla_cpu_enable_fast_math=true",
        "x64": False,
        "variant": "s32",
        "batch_size": 8,
    }
    assert set(other) == {f.name for f in dataclasses.fields(CacheKey)}  # every field is tried
    digests = {KEY.digest}
    for field, value in other.items():
        changed = dataclasses.replace(KEY, **{field: value})
        assert changed.digest not in digests, field
        digests.add(changed.digest)
    assert dataclasses.replace(KEY).digest == KEY.digest  # equal keys share an entry


def test_executable_key_reads_flags_x64_options_and_label(monkeypatch: pytest.MonkeyPatch) -> None:
    import jax
    import jaxlib
    from jax._src.lib import xla_client

    artifact = AFFINE_B2.read_bytes()
    device = jax.devices()[0]
    options = xla_client.CompileOptions()
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    jax.config.update("jax_enable_x64", False)
    base = executable_key(artifact, device, options, LABEL)
    assert (base.platform, base.device_kind, base.device_id) == ("cpu", device.device_kind, 0)
    assert base.jaxlib_version.startswith(jaxlib.__version__ + "/")
    assert base == executable_key(artifact, device, options, ExecutableLabel("renamed", "", 2))
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    flagged = executable_key(artifact, device, options, LABEL)
    monkeypatch.delenv("XLA_FLAGS")
    jax.config.update("jax_enable_x64", True)
    wide = executable_key(artifact, device, options, LABEL)
    other_options = xla_client.CompileOptions()
    other_options.num_replicas = 2
    replicated = executable_key(artifact, device, other_options, LABEL)
    variant = executable_key(artifact, device, options, ExecutableLabel("affine", "s32", 2))
    size = executable_key(artifact, device, options, ExecutableLabel("affine", "", 4))
    edited = executable_key(artifact + b" ", device, options, LABEL)
    keys = [base, flagged, wide, replicated, variant, size, edited]
    assert len({k.digest for k in keys}) == len(keys)


# -- entries -------------------------------------------------------------------------------------


def test_miss_then_hit(tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path / "cache")
    assert cache.get(KEY) is None
    assert cache.put(KEY, b"payload" * 100, info={"signature": [1, "f32"]})
    assert cache.get(KEY) == CachedEntry(b"payload" * 100, {"signature": [1, "f32"]})
    assert cache.get(dataclasses.replace(KEY, batch_size=4)) is None
    (entry,) = (tmp_path / "cache").iterdir()
    assert entry.name == KEY.digest + ".xexe"
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncate", "truncated"),
        ("version", "entry format 99, this hloserve reads 1..1"),
        ("garbage", "bad magic"),
        ("flip", "checksum mismatch"),
        ("empty", "truncated (0 bytes"),
    ],
)
def test_a_bad_entry_is_logged_ignored_and_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str, message: str
) -> None:
    cache = ExecutableCache(tmp_path)
    cache.put(KEY, bytes(range(256)) * 40)
    path = cache.path(KEY)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "version":
        data[8:12] = (99).to_bytes(4, "big")
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "flip":
        data[-1] ^= 0xFF
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert cache.get(KEY, LABEL) is None
    (warning,) = warnings_of(caplog)
    assert message in warning and "model 'affine' batch size 2" in warning, warning
    assert not path.exists()
    assert cache.put(KEY, b"again") and cache.get(KEY) == CachedEntry(b"again", {})  # rewritten


def test_an_entry_of_another_key_is_not_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ExecutableCache(tmp_path)
    cache.put(KEY, b"for batch size 2")
    other = dataclasses.replace(KEY, batch_size=4)
    os.replace(cache.path(KEY), cache.path(other))  # e.g. a copied or renamed file
    with caplog.at_level(logging.WARNING):
        assert cache.get(other) is None
    assert "written for another key (differs in ['batch_size'])" in warnings_of(caplog)[0]


def test_lru_bound_deletes_the_least_recently_used(tmp_path: Path) -> None:
    keys = [dataclasses.replace(KEY, batch_size=n) for n in range(4)]
    probe = ExecutableCache(tmp_path / "probe")
    probe.put(keys[0], b"x" * 1000)
    size = probe.path(keys[0]).stat().st_size
    cache = ExecutableCache(tmp_path / "cache", max_bytes=3 * size + size // 2)
    now = time.time()
    for age, key in zip((300, 200, 100), keys[:3], strict=True):
        assert cache.put(key, b"x" * 1000)
        os.utime(cache.path(key), (now - age, now - age))
    assert cache.get(keys[0]) is not None  # used now: the most recent
    assert cache.put(keys[3], b"x" * 1000)
    present = [cache.path(k).exists() for k in keys]
    assert present == [True, False, True, True]
    total = sum(p.stat().st_size for p in (tmp_path / "cache").iterdir())
    assert total <= cache.max_bytes


def test_an_entry_over_the_bound_is_not_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ExecutableCache(tmp_path, max_bytes=500)
    with caplog.at_level(logging.WARNING):
        assert not cache.put(KEY, b"x" * 1000, LABEL)
    assert "over the bound of 500 bytes" in warnings_of(caplog)[0]
    assert list(tmp_path.iterdir()) == []


def test_stale_temporary_files_are_removed_fresh_ones_kept(tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path)
    stale, fresh = tmp_path / ".tmp-dead.xexe", tmp_path / ".tmp-busy.xexe"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    old = time.time() - xc.STALE_TMP_S - 10
    os.utime(stale, (old, old))
    cache.put(KEY, b"ok")
    assert not stale.exists() and fresh.exists()
    assert cache.get(KEY) == CachedEntry(b"ok", {})


def test_disabled_cache_reads_and_writes_nothing(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    cache = ExecutableCache(None, observer=lambda model, source: seen.append((model, source)))
    assert not cache.enabled and cache.get(KEY) is None and not cache.put(KEY, b"x")
    cache.counted(LABEL, xc.COMPILED, 0.5)
    assert seen == [("affine", "compiled")]
    assert cache.summary() == (
        "executables: 1 compiled (0.50 s), 0 loaded from the cache (0.00 s); cache off"
    )


WRITER = """
import sys, time
from pathlib import Path
from hloserve.triton_backend.runtime.executable_cache import ExecutableCache
from tests.triton_backend.test_executable_cache import KEY
directory, fill, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cache = ExecutableCache(directory)
payload = bytes([fill]) * 400_000
if mode == "inplace":  # a writer that does NOT write atomically: the reader must catch it
    scratch = ExecutableCache(Path(directory).parent / f"scratch{fill}")
    scratch.put(KEY, payload)
    data = scratch.path(KEY).read_bytes()
for _ in range(count):
    if mode == "atomic":
        cache.put(KEY, payload)
    else:
        with open(cache.path(KEY), "wb") as out:
            for start in range(0, len(data), 65536):
                out.write(data[start : start + 65536])
                out.flush()
                time.sleep(0.001)
"""


def _race(tmp_path: Path, mode: str, count: int) -> tuple[dict[bytes, int], int]:
    """Two writer processes store different payloads under one key while this one reads."""
    directory = tmp_path / "shared"
    directory.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(directory), str(fill), str(count), mode], env=env
        )
        for fill in (1, 2)
    ]
    cache = ExecutableCache(directory)
    seen: dict[bytes, int] = {}
    reads = 0
    deadline = time.monotonic() + 120
    try:
        while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
            entry = cache.get(KEY)
            reads += 1
            if entry is not None:
                payload = entry.payload
                assert payload in (b"\x01" * 400_000, b"\x02" * 400_000)
                seen[payload[:1]] = seen.get(payload[:1], 0) + 1
    finally:
        for w in writers:
            w.wait(timeout=60)
    assert [w.returncode for w in writers] == [0, 0]
    return seen, reads


def test_concurrent_writers_in_two_processes_never_expose_half_an_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        seen, reads = _race(tmp_path, "atomic", 150)
    assert warnings_of(caplog) == []  # no torn, truncated or corrupt entry was ever read
    assert sum(seen.values()) > 0, f"{reads} reads saw no entry: the race did not happen"
    assert ExecutableCache(tmp_path / "shared").get(KEY) is not None
    assert not [p for p in (tmp_path / "shared").iterdir() if p.name.startswith(".tmp-")]


def test_a_non_atomic_writer_is_caught_by_the_checks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The control for the test above: writing in place is detected, never served."""
    with caplog.at_level(logging.WARNING):
        _race(tmp_path, "inplace", 20)  # every payload served was whole (asserted inside)
    assert any("truncated" in w or "checksum" in w for w in warnings_of(caplog))


# -- settings ------------------------------------------------------------------------------------


def test_default_directory_follows_xdg(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert default_directory(home) == tmp_path / ".cache" / "hloserve" / "executables"
    xdg = {**home, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert default_directory(xdg) == tmp_path / "xdg" / "hloserve" / "executables"
    relative = {**home, "XDG_CACHE_HOME": "relative"}  # the spec says: ignore it
    assert default_directory(relative) == tmp_path / ".cache" / "hloserve" / "executables"


def test_settings_parameters_over_environment_over_defaults() -> None:
    assert cache_settings({}, {}) == ExecutableCacheSettings(cache="", cache_bytes=4 << 30)
    env = {"HLOSERVE_EXECUTABLE_CACHE": "off", "HLOSERVE_EXECUTABLE_CACHE_BYTES": "1000"}
    assert cache_settings({}, env) == ExecutableCacheSettings(cache="off", cache_bytes=1000)
    params = {"hloserve.executable_cache": "/srv/x", "hloserve.executable_cache_bytes": "7"}
    assert cache_settings(params, env) == ExecutableCacheSettings(cache="/srv/x", cache_bytes=7)


@pytest.mark.parametrize(
    ("params", "env", "message"),
    [
        ({"hloserve.executable_cache_bytes": "0"}, {}, "must be a positive integer"),
        ({"hloserve.executable_cache_bytes": "4G"}, {}, "got '4G'"),
        ({}, {"HLOSERVE_EXECUTABLE_CACHE_BYTES": "lots"}, "HLOSERVE_EXECUTABLE_CACHE_BYTES"),
        ({}, {"HLOSERVE_EXECUTABLE_CACHE_DIR": "/x"}, "names no setting"),
    ],
)
def test_bad_settings_are_refused(
    params: dict[str, str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        cache_settings(params, env)


def test_off_disables_and_a_directory_enables(tmp_path: Path) -> None:
    assert not executable_cache(ExecutableCacheSettings(cache="off")).enabled
    assert not executable_cache(ExecutableCacheSettings(cache="OFF")).enabled
    cache = executable_cache(ExecutableCacheSettings(cache=str(tmp_path), cache_bytes=9))
    assert (cache.directory, cache.max_bytes) == (tmp_path, 9)


# -- the compile path ----------------------------------------------------------------------------


def _affine_args(executable: Any) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s.shape).astype(np.float32) for s in executable.signature.inputs]


def test_serialize_and_deserialize_executable_round_trip() -> None:
    """The client's serialize_executable/deserialize_executable (jaxlib 0.7.1 and newest)."""
    compiled = compile_artifact(AFFINE_B2.read_bytes())
    payload = serialize_executable(compiled.loaded)
    assert isinstance(payload, bytes) and payload
    loaded = deserialize_executable(payload, compiled.device)
    again = dataclasses.replace(compiled, loaded=loaded)
    args = _affine_args(compiled)
    for a, b in zip(compiled.run_numpy(args), again.run_numpy(args), strict=True):
        np.testing.assert_array_equal(a, b)


def test_loaded_executable_serialize_where_jaxlib_has_it() -> None:
    """Newer jaxlib (0.10.2) also has ``LoadedExecutable.serialize``: its bytes load too."""
    compiled = compile_artifact(AFFINE_B2.read_bytes())
    if not hasattr(compiled.loaded, "serialize"):  # the serving env's jaxlib: only the client's
        import jaxlib  # form, which the test above covers (a skip would fail the serving leg)

        assert jaxlib.__version__.startswith("0.7."), jaxlib.__version__
        return
    loaded = deserialize_executable(bytes(compiled.loaded.serialize()), compiled.device)
    args = _affine_args(compiled)
    again = dataclasses.replace(compiled, loaded=loaded)
    for a, b in zip(compiled.run_numpy(args), again.run_numpy(args), strict=True):
        np.testing.assert_array_equal(a, b)


def test_compile_artifact_writes_then_loads_from_the_cache(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    cache = ExecutableCache(tmp_path, observer=lambda m, s: seen.append((m, s)))
    artifact = AFFINE_B2.read_bytes()
    first = compile_artifact(artifact, cache=cache, label=LABEL)
    second = compile_artifact(artifact, cache=cache, label=ExecutableLabel("renamed", "", 2))
    assert (first.from_cache, second.from_cache) == (False, True)
    assert len(list(tmp_path.glob("*.xexe"))) == 1
    assert seen == [("affine", "compiled"), ("renamed", "cache")]
    assert cache.counts == {"compiled": 1, "cache": 1}
    args = _affine_args(first)
    for a, b in zip(first.run_numpy(args), second.run_numpy(args), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_entry_that_does_not_deserialize_is_recompiled_and_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import jax
    from jax._src.lib import xla_client

    cache = ExecutableCache(tmp_path)
    artifact = AFFINE_B2.read_bytes()
    key = executable_key(artifact, jax.devices()[0], xla_client.CompileOptions(), LABEL)
    assert not compile_artifact(artifact, cache=cache, label=LABEL).from_cache
    good = cache.get(key)
    assert good is not None and set(good.info) == {"signature"}
    for info in (good.info, {}):  # a well-formed entry: its payload or its info is wrong
        cache.put(key, b"no executable", info=info)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            again = compile_artifact(artifact, cache=cache, label=LABEL)
        assert not again.from_cache
        assert "does not load" in warnings_of(caplog)[0]
        assert compile_artifact(artifact, cache=cache, label=LABEL).from_cache  # rewritten


def test_runtime_from_args_logs_compiled_then_cached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from hloserve import names
    from hloserve.triton_backend.runtime.core import RuntimeModel

    repo = tmp_path / "repo"
    params = {
        names.PARAM_REPOSITORY_FORMAT: str(names.REPOSITORY_FORMAT),
        "hloserve.executable_cache": str(tmp_path / "cache"),
    }
    args = ModelArgs(
        name="hloserve_runtime",
        model_dir=repo / "hloserve_runtime",
        version="1",
        config={"parameters": {k: {"string_value": v} for k, v in params.items()}},
    )
    x = np.load(GOLDEN / "affine.expected.npz")["x"][:2]
    answers, counted = [], []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hloserve.triton_backend.runtime"):
            runtime = RuntimeModel.from_args(args, executables=lambda m, s: counted.append((m, s)))
            loaded = runtime.acquire("affine", GOLDEN / "affine")  # as a front asks for it
        answers.append(dict(enumerate(runtime.run(loaded, 0, 2, [x]))))
        runtime.release(loaded.key)
        runtime.close()
        summaries = [r.getMessage() for r in caplog.records if "executables:" in r.getMessage()]
        assert len(summaries) == 1, summaries
        if len(answers) == 1:
            assert summaries[0].startswith("executables: 2 compiled"), summaries
            assert " 0 loaded from the cache" in summaries[0]
        else:
            assert summaries[0].startswith("executables: 0 compiled"), summaries
            assert " 2 loaded from the cache" in summaries[0]
    assert counted == [("affine", "compiled")] * 2 + [("affine", "cache")] * 2
    for name, value in answers[0].items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(answers[1][name]))


def test_runtime_refuses_a_bad_bound_naming_the_model(tmp_path: Path) -> None:
    from hloserve import names
    from hloserve.triton_backend.runtime.core import RuntimeModel

    params = {
        names.PARAM_REPOSITORY_FORMAT: str(names.REPOSITORY_FORMAT),
        "hloserve.executable_cache_bytes": "-1",
    }
    args = ModelArgs(
        name="hloserve_runtime",
        model_dir=tmp_path / "hloserve_runtime",
        version="1",
        config={"parameters": {k: {"string_value": v} for k, v in params.items()}},
    )
    with pytest.raises(InvalidArgumentError, match="model 'hloserve_runtime': parameter"):
        RuntimeModel.from_args(args)


def test_a_relative_directory_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="'cache' must be an absolute path"):
        executable_cache(ExecutableCacheSettings(cache="cache"))
