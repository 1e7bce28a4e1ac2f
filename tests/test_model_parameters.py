"""The config.pbtxt parameter schema (hloserve.model_parameters): pure logic, no server.

Round trips writer -> reader for every model kind (the dataclasses, the repository builder's
configs and the checked-in golden configs), and every refusal: each names the model, the key,
the expected form and the text found, with status INVALID_ARGUMENT.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hloserve import names
from hloserve.bundle.bundle import load_bundle
from hloserve.errors import InvalidArgumentError, Status
from hloserve.model_parameters import (
    FrontParameters,
    MetaParameters,
    ModelParameters,
    RuntimeParameters,
    string_values,
)
from hloserve.model_repository_tools.build_options import BuildOptions
from hloserve.model_repository_tools.config import (
    front_config,
    meta_config,
    parse_config,
    runtime_config,
)

GOLDEN = Path(__file__).resolve().parent / "golden"
#: Tests that build or parse a ``ModelConfig`` need tritonclient's protos (absent from the
#: numpy-2 leg); the schema's own tests run in both legs.
needs_protos = pytest.mark.usefixtures("model_config_protos")
FORMAT = {names.PARAM_REPOSITORY_FORMAT: str(names.REPOSITORY_FORMAT)}


@pytest.fixture
def model_config_protos() -> None:
    pytest.importorskip("tritonclient.grpc.model_config_pb2")


def _config_params(config: Any) -> dict[str, str]:
    return string_values(config.parameters)


# -- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        FrontParameters(bundle="1/bundle"),
        FrontParameters(
            bundle="3/bundle",
            runtime_model="other_runtime",
            max_request_bytes=16,
            front_inflight=8,
            runtime_wait_s=2.5,
        ),
        MetaParameters(bundle="1/bundle"),
        MetaParameters(bundle="2/bundle", meta_calls=("a", "b"), meta_concurrency=5),
        RuntimeParameters(),
        RuntimeParameters(
            weight_cache_bytes=1 << 20,
            residency={"a": "device", "b": "unpinned"},
            compaction_interval=8,
            scheduling="edf",
            model_weights={"a": 3.0, "b": 0.5},
            executable_cache="/srv/cache",
            executable_cache_bytes=1000,
            foreign_bytes={"f": 10, "g": 0},
        ),
        RuntimeParameters(weight_cache_fraction=0.25, executable_cache="off"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_round_trip(values: ModelParameters) -> None:
    written = values.to_parameters()
    assert all(isinstance(v, str) for v in written.values())
    assert type(values).from_parameters("m", written) == values


def test_the_writer_leaves_defaults_out_where_the_schema_says() -> None:
    assert FrontParameters(bundle="1/bundle").to_parameters() == {
        names.PARAM_BUNDLE: "1/bundle",
        names.PARAM_RUNTIME_MODEL: names.RUNTIME_MODEL,
        names.PARAM_REPOSITORY_FORMAT: "2",
        names.PARAM_MAX_REQUEST_BYTES: str(names.DEFAULT_MAX_REQUEST_BYTES),
    }
    assert MetaParameters(bundle="1/bundle").to_parameters() == {
        names.PARAM_BUNDLE: "1/bundle",
        names.PARAM_META_CALLS: "",  # a compute-only meta: written, empty
        names.PARAM_META_CONCURRENCY: str(names.DEFAULT_META_CONCURRENCY),
        names.PARAM_REPOSITORY_FORMAT: "2",
    }
    assert RuntimeParameters().to_parameters() == FORMAT
    # values equal to the defaults inside a mapping are left out too
    plain = RuntimeParameters(residency={"a": "system"}, model_weights={"a": 1.0})
    assert plain.to_parameters() == FORMAT


def test_absent_or_blank_text_means_the_default_and_other_keys_are_ignored() -> None:
    read = FrontParameters.from_parameters(
        "m", {names.PARAM_BUNDLE: "1/bundle", names.PARAM_FRONT_INFLIGHT: "  ", "x": "y"}
    )
    assert read == FrontParameters(bundle="1/bundle")
    assert read.runtime_wait_s == names.DEFAULT_RUNTIME_WAIT_S
    runtime = RuntimeParameters.from_parameters("r", {**FORMAT, names.PARAM_SCHEDULING: ""})
    assert runtime == RuntimeParameters()
    assert runtime.scheduling == names.SCHEDULING_DISCIPLINES[0]


def test_text_is_normalised_as_the_readers_did() -> None:
    runtime = RuntimeParameters.from_parameters(
        "r",
        {
            **FORMAT,
            names.PARAM_SCHEDULING: " EDF ",
            names.PARAM_MODEL_WEIGHTS: "a=3, b=0.5",
            names.PARAM_RESIDENCY: "a = Device",
        },
    )
    assert runtime.scheduling == "edf"
    assert dict(runtime.model_weights) == {"a": 3.0, "b": 0.5}
    assert dict(runtime.residency) == {"a": "device"}
    meta = MetaParameters.from_parameters(
        "m", {names.PARAM_BUNDLE: "1/bundle", names.PARAM_META_CALLS: " a, ,b "}
    )
    assert meta.meta_calls == ("a", "b")


def test_values_are_frozen() -> None:
    runtime = RuntimeParameters(residency={"a": "device"})
    with pytest.raises(TypeError):
        runtime.residency["b"] = "device"  # type: ignore[index]
    with pytest.raises(AttributeError):
        runtime.scheduling = "fifo"  # type: ignore[misc]


@needs_protos
def test_the_builder_writes_what_the_readers_read() -> None:
    manifest = load_bundle(GOLDEN / "affine").manifest
    front = front_config(
        "affine", manifest, BuildOptions(max_queue_delay_us=0, max_request_bytes=4096)
    )
    assert FrontParameters.from_parameters("affine", _config_params(front)) == FrontParameters(
        bundle=names.BUNDLE_SUBDIR, max_request_bytes=4096
    )
    meta_manifest = load_bundle(Path(__file__).resolve().parent / "meta_probe").manifest
    meta = meta_config("probe", meta_manifest, BuildOptions(meta_concurrency=3))
    assert MetaParameters.from_parameters("probe", _config_params(meta)) == MetaParameters(
        bundle=names.BUNDLE_SUBDIR, meta_calls=tuple(meta_manifest.calls), meta_concurrency=3
    )
    values: dict[str, Any] = {
        "weight_cache_fraction": 0.5,
        "residency": {"affine": "device"},
        "compaction_interval": 4,
        "scheduling": "fifo",
        "model_weights": {"affine": 2.0},
        "executable_cache": "off",
        "executable_cache_bytes": 99,
        "foreign_bytes": {"plus_one": 7},
    }
    runtime = runtime_config([("affine", manifest)], RuntimeParameters(**values))
    read = RuntimeParameters.from_parameters(names.RUNTIME_MODEL, _config_params(runtime))
    assert read == RuntimeParameters(**values)


@needs_protos
@pytest.mark.parametrize(
    ("file", "kind"),
    [
        ("affine.config.pbtxt", FrontParameters),
        ("meta.config.pbtxt", MetaParameters),
        ("hloserve_runtime.config.pbtxt", RuntimeParameters),
        ("hloserve_runtime.weight_cache.config.pbtxt", RuntimeParameters),
    ],
)
def test_golden_configs_read_and_write_back_unchanged(
    file: str, kind: type[ModelParameters]
) -> None:
    params = _config_params(parse_config(GOLDEN / "repository" / file))
    assert kind.from_parameters("m", params).to_parameters() == params


def test_read_one_key() -> None:
    params = {names.PARAM_WEIGHT_CACHE_BYTES: "7"}  # no repository format: not read here
    assert RuntimeParameters.read("r", params, names.PARAM_WEIGHT_CACHE_BYTES) == 7
    assert RuntimeParameters.read("r", params, names.PARAM_FOREIGN_BYTES) == {}
    with pytest.raises(KeyError):
        RuntimeParameters.read("r", params, names.PARAM_BUNDLE)


# -- refusals -------------------------------------------------------------------------------

FRONT = {names.PARAM_BUNDLE: "1/bundle"}
META = {names.PARAM_BUNDLE: "1/bundle"}

REFUSED = [
    (FrontParameters, FRONT, names.PARAM_MAX_REQUEST_BYTES, "0", "a positive integer"),
    (FrontParameters, FRONT, names.PARAM_MAX_REQUEST_BYTES, "1e9", "a positive integer"),
    (FrontParameters, FRONT, names.PARAM_FRONT_INFLIGHT, "-1", "a non-negative integer"),
    (FrontParameters, FRONT, names.PARAM_FRONT_INFLIGHT, "²", "a non-negative integer"),
    (FrontParameters, FRONT, names.PARAM_RUNTIME_WAIT_S, "soon", "a number of seconds"),
    (FrontParameters, FRONT, names.PARAM_RUNTIME_WAIT_S, "-1", "a number of seconds >= 0"),
    (FrontParameters, FRONT, names.PARAM_RUNTIME_WAIT_S, "nan", "a number of seconds"),
    (MetaParameters, META, names.PARAM_META_CONCURRENCY, "0", "an integer >= 1"),
    (MetaParameters, META, names.PARAM_META_CONCURRENCY, "two", "an integer >= 1"),
    (RuntimeParameters, FORMAT, names.PARAM_WEIGHT_CACHE_BYTES, "1G", "a non-negative integer"),
    (RuntimeParameters, FORMAT, names.PARAM_WEIGHT_CACHE_FRACTION, "0", "a number in (0, 1]"),
    (RuntimeParameters, FORMAT, names.PARAM_WEIGHT_CACHE_FRACTION, "1.5", "a number in (0, 1]"),
    (RuntimeParameters, FORMAT, names.PARAM_WEIGHT_CACHE_FRACTION, "half", "a number in (0, 1]"),
    (RuntimeParameters, FORMAT, names.PARAM_RESIDENCY, "a=gpu", "residencies from"),
    (RuntimeParameters, FORMAT, names.PARAM_RESIDENCY, "a", "'<model>=<residency>,...'"),
    (RuntimeParameters, FORMAT, names.PARAM_COMPACTION_INTERVAL, "x", "a non-negative integer"),
    (RuntimeParameters, FORMAT, names.PARAM_SCHEDULING, "lifo", "one of ['fair', 'fifo'"),
    (RuntimeParameters, FORMAT, names.PARAM_MODEL_WEIGHTS, "a=0", "weights > 0"),
    (RuntimeParameters, FORMAT, names.PARAM_MODEL_WEIGHTS, "a=1,a=2", "weights > 0"),
    (RuntimeParameters, FORMAT, names.PARAM_EXECUTABLE_CACHE_BYTES, "0", "a positive integer"),
    (RuntimeParameters, FORMAT, names.PARAM_EXECUTABLE_CACHE_BYTES, "4G", "a positive integer"),
    (RuntimeParameters, FORMAT, names.PARAM_FOREIGN_BYTES, "f=-1", "bytes >= 0"),
]


@pytest.mark.parametrize(
    ("kind", "base", "key", "text", "expected"), REFUSED, ids=[f"{r[2]}={r[3]}" for r in REFUSED]
)
def test_a_malformed_value_is_refused_naming_model_key_form_and_text(
    kind: type[ModelParameters], base: dict[str, str], key: str, text: str, expected: str
) -> None:
    params = {**base, key: text}
    for read in (
        lambda: kind.from_parameters("model_x", params),
        lambda: kind.read("model_x", params, key),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            read()
        message = info.value.message
        assert info.value.status is Status.INVALID_ARGUMENT
        assert message.startswith(f"model 'model_x': parameter {key!r} must be "), message
        assert expected in message and f"got {text!r}" in message, message


@pytest.mark.parametrize(
    ("kind", "params", "key"),
    [
        (FrontParameters, {}, names.PARAM_BUNDLE),
        (FrontParameters, {names.PARAM_BUNDLE: "  "}, names.PARAM_BUNDLE),
        (MetaParameters, {names.PARAM_META_CONCURRENCY: "2"}, names.PARAM_BUNDLE),
        (RuntimeParameters, {}, names.PARAM_REPOSITORY_FORMAT),
    ],
)
def test_a_missing_required_parameter_is_refused(
    kind: type[ModelParameters], params: dict[str, str], key: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=r"model 'm': config\.pbtxt lacks parameter"):
        kind.from_parameters("m", params)
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(key)) + r".*hloserve repo build"):
        kind.from_parameters("m", params)


@pytest.mark.parametrize("kind", [FrontParameters, MetaParameters, RuntimeParameters])
@pytest.mark.parametrize("text", ["1", "9", "two"])
def test_an_unsupported_repository_format_is_refused(
    kind: type[ModelParameters], text: str
) -> None:
    params = {names.PARAM_BUNDLE: "1/bundle", names.PARAM_REPOSITORY_FORMAT: text}
    needle = (
        f"model 'm': repository format {text!r} is not supported; this hloserve serves formats "
        f"{names.MIN_REPOSITORY_FORMAT} to {names.MAX_REPOSITORY_FORMAT} (rebuild"
    )
    with pytest.raises(InvalidArgumentError, match=re.escape(needle)):
        kind.from_parameters("m", {k: v for k, v in params.items() if k in _keys(kind)})


def _keys(kind: type[ModelParameters]) -> set[str]:
    return {p.key for p in kind.SCHEMA}


def test_a_runtime_of_repository_format_1_is_refused_first() -> None:
    old = {names.PARAM_REPOSITORY_FORMAT: "1", names.PARAM_BUNDLES: "a,b"}
    with pytest.raises(InvalidArgumentError, match=r"model 'r': this repository was built by an"):
        RuntimeParameters.from_parameters("r", old)


def test_a_budget_in_bytes_and_as_a_fraction_is_refused() -> None:
    both = {
        **FORMAT,
        names.PARAM_WEIGHT_CACHE_BYTES: "100",
        names.PARAM_WEIGHT_CACHE_FRACTION: "0.5",
    }
    with pytest.raises(InvalidArgumentError, match=r"model 'r': parameters .* both set the budget"):
        RuntimeParameters.from_parameters("r", both)


def test_every_key_is_declared_once_per_kind_and_comes_from_names() -> None:
    declared = {v for k, v in vars(names).items() if k.startswith("PARAM_")}
    for kind in (FrontParameters, MetaParameters, RuntimeParameters):
        keys = [p.key for p in kind.SCHEMA]
        assert len(keys) == len(set(keys)) and set(keys) <= declared, kind
        attrs = {p.attr for p in kind.SCHEMA}
        assert attrs == {f.name for f in dataclasses.fields(kind)}, kind


@needs_protos
def test_string_values_reads_a_model_config() -> None:
    config = parse_config(GOLDEN / "repository" / "affine.config.pbtxt")
    assert string_values(config.parameters)[names.PARAM_BUNDLE] == names.BUNDLE_SUBDIR


def test_importing_it_costs_no_third_party_module() -> None:
    code = (
        "import sys; before = set(sys.modules); import hloserve.model_parameters; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new - set(sys.stdlib_module_names)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['hloserve']", out
