"""The ``hloserve.*`` parameters of the generated ``config.pbtxt`` files, each declared once.

Each model kind (:class:`FrontParameters`, :class:`MetaParameters`, :class:`RuntimeParameters`)
lists its :class:`Parameter` s; ``to_parameters`` writes them, ``from_parameters`` and ``read``
read them back. Keys: docs/serving.md ("Config parameters"). Values are ``string_value`` texts;
absent or blank means the default; a required one absent, or a malformed value, raises
:class:`~hloserve.errors.InvalidArgumentError` naming the model, key, expected form and text.
Standard library only: every Triton stub imports it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from hloserve import names
from hloserve.errors import InvalidArgumentError

_REBUILD = "regenerate the repository with `hloserve repo build`"


@dataclass(frozen=True)
class Parameter:
    """One config.pbtxt parameter of one model kind.

    Attributes:
        expected: the accepted form, for error messages ("a positive integer").
        parse: stripped non-blank text -> value; ValueError (its message added) if malformed.
        required: absent or blank text is refused (else it means the field's default).
        always: written even at its default.
        refusal: (model, text) -> the whole error message for a malformed value.
        attr: the dataclass field; "" = the key without ``hloserve.``.
    """

    key: str
    expected: str
    parse: Callable[[str], Any]
    write: Callable[[Any], str] = str
    required: bool = False
    always: bool = False
    refusal: Callable[[str, str], str] | None = None
    attr: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "attr", self.attr or self.key.removeprefix("hloserve."))

    def read(self, model: str, params: Mapping[str, str], default: Any) -> Any:
        """The typed value in ``params`` (``default`` when absent or blank); InvalidArgumentError
        when required and absent, or malformed."""
        text = params.get(self.key, "").strip()
        if not text:
            if self.required:
                raise InvalidArgumentError(
                    f"model {model!r}: config.pbtxt lacks parameter {self.key!r} ({_REBUILD})"
                )
            return default
        try:
            return self.parse(text)
        except ValueError as exc:
            if self.refusal is not None:
                raise InvalidArgumentError(self.refusal(model, text)) from None
            detail = f" ({exc})" if str(exc) else ""
            raise InvalidArgumentError(
                f"model {model!r}: parameter {self.key!r} must be {self.expected}, "
                f"got {text!r}{detail}"
            ) from None


def _integer(low: int) -> Callable[[str], int]:

    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or int(text) < low:
            raise ValueError("")
        return int(text)

    return parse


def _number(low: float, high: float, *, low_open: bool) -> Callable[[str], float]:

    def parse(text: str) -> float:
        value = float(text)  # ValueError: not a number
        above = value > low if low_open else value >= low
        if not (math.isfinite(value) and above and value <= high):
            raise ValueError("")
        return value

    return parse


def _choice(values: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in values:
            raise ValueError("")
        return text.lower()

    return parse


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in (i.strip() for i in text.split(names.BUNDLES_SEPARATOR)) if n)


def _format_refusal(model: str, text: str) -> str:
    return (
        f"model {model!r}: repository format {text!r} is not supported; this hloserve serves "
        f"formats {names.MIN_REPOSITORY_FORMAT} to {names.MAX_REPOSITORY_FORMAT} "
        "(rebuild the repository with `hloserve repo build`)"
    )


def _repository_format(*, required: bool) -> Parameter:
    return Parameter(
        names.PARAM_REPOSITORY_FORMAT,
        f"an integer from {names.MIN_REPOSITORY_FORMAT} to {names.MAX_REPOSITORY_FORMAT}",
        _format_parse,
        required=required,
        always=True,
        refusal=_format_refusal,
    )


def _format_parse(text: str) -> int:
    if not names.MIN_REPOSITORY_FORMAT <= _integer(0)(text) <= names.MAX_REPOSITORY_FORMAT:
        raise ValueError("")
    return int(text)


_BUNDLE = Parameter(
    names.PARAM_BUNDLE,
    "the bundle directory relative to the model directory",
    str,
    required=True,
    always=True,
)


P = TypeVar("P", bound="ModelParameters")


class ModelParameters:
    """What the three kinds share: reading, writing, one key at a time or all."""

    #: Every parameter of the kind, in the order the writer writes them.
    SCHEMA: ClassVar[tuple[Parameter, ...]] = ()
    #: Keys of older repository formats, refused with this message (model name first).
    LEGACY: ClassVar[Mapping[str, str]] = MappingProxyType({})

    @classmethod
    def from_parameters(cls: type[P], model: str, params: Mapping[str, str]) -> P:
        """Every parameter of this kind read from ``params`` (other keys are ignored); raises
        InvalidArgumentError: a legacy key, a required one absent, a malformed value or an
        inconsistent pair."""
        for key, message in cls.LEGACY.items():
            if key in params:
                raise InvalidArgumentError(f"model {model!r}: {message}")
        defaults = _defaults(cls)
        values = {p.attr: p.read(model, params, defaults.get(p.attr)) for p in cls.SCHEMA}
        result = cls(**values)
        result.check(model)
        return result

    @classmethod
    def read(cls, model: str, params: Mapping[str, str], key: str) -> Any:
        """The typed value of parameter ``key`` (its default when absent or blank); KeyError when
        not a parameter of this kind, InvalidArgumentError as :meth:`from_parameters`."""
        for p in cls.SCHEMA:
            if p.key == key:
                return p.read(model, params, _defaults(cls).get(p.attr))
        raise KeyError(key)

    def to_parameters(self) -> dict[str, str]:
        """Key -> text to write, defaults left out unless ``always``; ``from_parameters``
        inverts it."""
        defaults = _defaults(type(self))
        out = {}
        for p in self.SCHEMA:
            value = getattr(self, p.attr)
            text = p.write(value)
            if p.always or (text and value != defaults.get(p.attr)):
                out[p.key] = text
        return out

    def check(self, model: str) -> None:
        """Checks across parameters (none by default); InvalidArgumentError if they clash."""


def _defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


@dataclass(frozen=True)
class FrontParameters(ModelParameters):
    """A front model's parameters (backend ``hloserve_front``); each field is the parameter
    ``hloserve.<field>`` of docs/serving.md's "Config parameters" table."""

    bundle: str
    runtime_model: str = names.RUNTIME_MODEL
    repository_format: int = names.REPOSITORY_FORMAT
    max_request_bytes: int = names.DEFAULT_MAX_REQUEST_BYTES
    front_inflight: int = names.DEFAULT_FRONT_INFLIGHT
    runtime_wait_s: float = names.DEFAULT_RUNTIME_WAIT_S

    SCHEMA: ClassVar[tuple[Parameter, ...]] = (
        _BUNDLE,
        Parameter(names.PARAM_RUNTIME_MODEL, "a model name", str, always=True),
        _repository_format(required=False),
        Parameter(names.PARAM_MAX_REQUEST_BYTES, "a positive integer", _integer(1), always=True),
        Parameter(names.PARAM_FRONT_INFLIGHT, "a non-negative integer", _integer(0)),
        Parameter(
            names.PARAM_RUNTIME_WAIT_S,
            "a number of seconds >= 0",
            _number(0.0, math.inf, low_open=False),
            write=repr,
        ),
    )


@dataclass(frozen=True)
class MetaParameters(ModelParameters):
    """A meta model's parameters (backend ``hloserve_meta``); fields as in docs/serving.md's
    "Config parameters" table."""

    bundle: str
    meta_calls: tuple[str, ...] = ()
    meta_concurrency: int = names.DEFAULT_META_CONCURRENCY
    repository_format: int = names.REPOSITORY_FORMAT

    SCHEMA: ClassVar[tuple[Parameter, ...]] = (
        _BUNDLE,
        Parameter(
            names.PARAM_META_CALLS,
            "comma-separated model names",
            _names,
            write=names.BUNDLES_SEPARATOR.join,
            always=True,
        ),
        Parameter(names.PARAM_META_CONCURRENCY, "an integer >= 1", _integer(1), always=True),
        _repository_format(required=False),
    )


@dataclass(frozen=True)
class RuntimeParameters(ModelParameters):
    """The runtime model's parameters (backend ``hloserve_runtime``); fields as in
    docs/serving.md's "Config parameters" table (``foreign_bytes``:
    ``hloserve.foreign_memory_bytes``), bytes in bytes."""

    repository_format: int = names.REPOSITORY_FORMAT
    weight_cache_bytes: int = 0
    weight_cache_fraction: float = 0.0
    device_memory_fraction: float = 0.0
    residency: Mapping[str, str] = field(default_factory=dict)
    compaction_interval: int = 0
    scheduling: str = names.SCHEDULING_DISCIPLINES[0]
    model_weights: Mapping[str, float] = field(default_factory=dict)
    executable_cache: str = ""
    executable_cache_bytes: int = 0
    foreign_bytes: Mapping[str, int] = field(default_factory=dict)

    SCHEMA: ClassVar[tuple[Parameter, ...]] = (
        _repository_format(required=True),
        Parameter(names.PARAM_WEIGHT_CACHE_BYTES, "a non-negative integer", _integer(0)),
        *(
            Parameter(key, "a number in (0, 1]", _number(0.0, 1.0, low_open=True), write=repr)
            for key in (names.PARAM_WEIGHT_CACHE_FRACTION, names.PARAM_DEVICE_MEMORY_FRACTION)
        ),
        Parameter(
            names.PARAM_RESIDENCY,
            f"'<model>=<residency>,...' with residencies from {list(names.RESIDENCIES)}",
            names.parse_residency,
            write=lambda v: names.format_residency(dict(v)),
        ),
        Parameter(names.PARAM_COMPACTION_INTERVAL, "a non-negative integer", _integer(0)),
        Parameter(
            names.PARAM_SCHEDULING,
            f"one of {list(names.SCHEDULING_DISCIPLINES)}",
            _choice(names.SCHEDULING_DISCIPLINES),
        ),
        Parameter(
            names.PARAM_MODEL_WEIGHTS,
            "'<model>=<weight>,...' with weights > 0",
            names.parse_model_weights,
            write=lambda v: names.format_model_weights(dict(v)),
        ),
        Parameter(
            names.PARAM_EXECUTABLE_CACHE,
            f"an absolute directory or {names.EXECUTABLE_CACHE_OFF!r}",
            str,
        ),
        Parameter(names.PARAM_EXECUTABLE_CACHE_BYTES, "a positive integer (bytes)", _integer(1)),
        Parameter(
            names.PARAM_FOREIGN_BYTES,
            "'<model>=<bytes>,...' with bytes >= 0",
            names.parse_model_bytes,
            write=lambda v: names.format_model_bytes(dict(v)),
            attr="foreign_bytes",
        ),
    )
    LEGACY: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            names.PARAM_BUNDLES: "this repository was built by an older hloserve (its runtime "
            f"lists bundles in {names.PARAM_BUNDLES!r}); rebuild it with `hloserve repo build`",
        }
    )

    def __post_init__(self) -> None:
        for attr in ("residency", "model_weights", "foreign_bytes"):
            object.__setattr__(self, attr, MappingProxyType(dict(getattr(self, attr))))

    def check(self, model: str) -> None:
        """Refuse a budget given both in bytes and as a fraction (InvalidArgumentError)."""
        check_one_budget(model, self.weight_cache_bytes, self.weight_cache_fraction)


def check_one_budget(model: str, budget_bytes: int, fraction: float) -> None:
    """Raise InvalidArgumentError when both ``budget_bytes`` and ``fraction`` are non-zero."""
    if budget_bytes and fraction:
        raise InvalidArgumentError(
            f"model {model!r}: parameters {names.PARAM_WEIGHT_CACHE_BYTES!r} and "
            f"{names.PARAM_WEIGHT_CACHE_FRACTION!r} both set the budget; keep one"
        )


def string_values(parameters: Mapping[str, Any]) -> dict[str, str]:
    """A ``ModelConfig.parameters`` map (values with ``string_value``) as key -> text."""
    return {key: str(value.string_value) for key, value in parameters.items()}


@dataclass(frozen=True)
class ModelArgs:
    """What Triton hands a Python model's ``initialize(args)``: ``model_dir`` is ``<repo>/<name>``
    (Triton's ``model_repository`` key, checked on 2.51), ``config`` the auto-completed
    ``config.pbtxt`` as JSON."""

    name: str
    model_dir: Path
    version: str
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_triton(cls, args: Mapping[str, str]) -> ModelArgs:
        """Parse Triton's ``args`` (all values are strings; ``model_config`` is JSON)."""
        return cls(
            name=args["model_name"],
            model_dir=Path(args["model_repository"]),
            version=args.get("model_version", ""),
            config=json.loads(args.get("model_config", "{}")),
        )

    @property
    def parameters(self) -> dict[str, str]:
        """``parameters`` of the config as plain strings (``{key: {string_value: v}}``)."""
        params = self.config.get("parameters") or {}
        return {k: str(v.get("string_value", "")) for k, v in params.items()}
