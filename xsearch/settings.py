"""Settings: one dataclass per verb is the only definition of its options.

Each verb of the library (search, sweep, train, compress, export, serve, ...) takes a dataclass
deriving from ``Settings`` whose fields are declared with ``option(default, help, ...)``: the type
comes from the annotation, and ``choices`` and the bounds ``gt``/``ge``/``le``/``lt`` from the
declaration. A settings object validates itself on construction (types, choices, bounds, then the
class's cross-field ``rules``) and raises ``SettingError`` naming the field, which every front end
renders in its own words: the CLI builds its flags from the fields (``xsearch.cli.args``) and names
them ``--train-steps``; a pipeline.yaml section *is* such a dataclass (``from_mapping``) and names
them ``search.train_steps``; its commented defaults are written from the fields (``yaml_lines``).

    @dataclass
    class TrainSettings(Settings):
        steps: int | None = option(None, "optimizer steps", gt=0)
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import types
import typing
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any

import yaml

from xsearch.errors import SettingError

_NO_DEFAULT = dataclasses.MISSING


def option(
    default: Any = _NO_DEFAULT,
    help: str = "",  # noqa: A002 (argparse's word)
    *,
    factory: Callable[[], Any] | None = None,
    choices: Iterable[Any] | Callable[[], Iterable[Any]] | None = None,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    cli: bool = True,
) -> Any:
    """A settings field.

    Args:
        default: the default value (or ``factory`` for a mutable one).
        help: one line for ``--help`` and the pipeline.yaml comment.
        choices: the valid values, or a callable returning them (a registry looked up late).
        gt, ge, lt, le: bounds of a number (``None`` values are never checked).
        flag: the command-line flag, when not ``--`` + the name with dashes.
        metavar: the value's name in ``--help``.
        cli: whether the CLI offers the field as a flag (some are set by the command itself).
    """
    metadata = {"help": help, "choices": choices, "gt": gt, "ge": ge, "lt": lt, "le": le, "flag": flag,
                "metavar": metavar, "cli": cli}  # fmt: skip
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def same_as(cls: type, name: str, default: Any = _NO_DEFAULT, **changes: Any) -> Any:
    """A field declared like ``cls``'s field ``name`` (its help, choices, bounds), optionally with
    another default: for a setting that two verbs share (the target of a search and of a sweep)."""
    f = _field(cls, name)
    meta = {**f.metadata, **changes}
    if default is _NO_DEFAULT:
        if f.default_factory is not _NO_DEFAULT:
            return dataclasses.field(default_factory=f.default_factory, metadata=meta)
        default = f.default
    return dataclasses.field(default=default, metadata=meta)


def _field(cls: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no field {name!r}")


@dataclasses.dataclass
class Settings:
    """Base of the settings dataclasses: validates every field on construction.

    Subclasses add cross-field rules in ``rules`` (raising ``SettingError``); it runs after the
    fields are type-checked and may fill in defaults that depend on other fields.
    """

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            value = coerce(hints[f.name], getattr(self, f.name), f.name)
            setattr(self, f.name, value)
            _check_field(f, value)
        self.rules()

    def rules(self) -> None:
        """Cross-field rules (override)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def with_defaults(cls, recorded: Mapping[str, Any]) -> dict[str, Any]:
        """A recorded ``to_dict()`` with the options it predates at their defaults (a checkpoint written before
        an option existed was made as that option's default says)."""
        return {**{f.name: default_of(f) for f in option_fields(cls)}, **recorded}


def differing_keys(held: Mapping[str, Any], now: Mapping[str, Any], keys: Iterable[str] | None = None) -> list[str]:
    """The keys whose values differ between two records (of ``keys`` in their order, or of both, sorted); a key
    one record lacks differs unless both lack it."""
    keys = sorted({*held, *now}) if keys is None else list(keys)
    return [k for k in keys if held.get(k) != now.get(k)]


def show_differences(held: Mapping[str, Any], now: Mapping[str, Any], keys: Iterable[str] | None = None, *,
                     held_as: str = "there", now_as: str = "now") -> str:  # fmt: skip
    """Each differing key with both values, for a message: ``"lr 0.003 there, 0.001 now; steps 10 there, 20 now"``.

    ``held`` is what was recorded (a checkpoint, a file), ``now`` what is asked for; a value a record lacks shows
    as ``None``.
    """
    return "; ".join(f"{k} {held.get(k)!r} {held_as}, {now.get(k)!r} {now_as}" for k in differing_keys(held, now, keys))


def _hints(cls: type) -> dict[str, Any]:
    cached = cls.__dict__.get("_xsearch_hints")
    if cached is None:
        cached = typing.get_type_hints(cls)
        cls._xsearch_hints = cached
    return cached


def type_of(cls: type, name: str) -> Any:
    """The annotated type of field ``name`` of ``cls`` (``base_type`` strips an ``Optional``)."""
    return _hints(cls)[name]


def base_type(tp: Any) -> tuple[Any, bool]:
    """``(T, nullable)`` for ``T``, ``T | None`` or ``Optional[T]``."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], type(None) in args
        return tp, type(None) in args
    return tp, False


_KIND = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def coerce(tp: Any, value: Any, name: str) -> Any:
    """``value`` checked against the type ``tp`` (ints accepted where floats are; bools are not numbers).

    Raises:
        SettingError: a value of another type, naming the field.
    """
    inner, nullable = base_type(tp)
    if value is None:
        if nullable or inner is Any:
            return None
        raise SettingError(name, "{0} must be " + _describe(inner) + ", got null")
    origin = typing.get_origin(inner)
    if inner is Any:
        return value
    if origin in (dict, Mapping) or inner is dict:
        if not isinstance(value, Mapping):
            raise SettingError(name, "{0} must be a mapping, got " + _show(value))
        return dict(value)
    if origin in (list, tuple) or inner in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise SettingError(name, "{0} must be a list, got " + _show(value))
        (item,) = typing.get_args(inner)[:1] or (Any,)
        return [coerce(item, v, f"{name}[{i}]") for i, v in enumerate(value)]
    number = not isinstance(value, bool)  # (numpy's bool is no numbers.Integral either)
    ok = {
        int: number and isinstance(value, numbers.Integral),
        float: number and isinstance(value, numbers.Real),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }.get(inner)
    if ok is None:
        return value  # a type this module does not check
    if not ok:
        raise SettingError(name, "{0} must be " + _describe(inner) + ", got " + _show(value))
    return {int: int, float: float}.get(inner, lambda v: v)(value)


def _describe(tp: Any) -> str:
    return _KIND.get(tp, getattr(tp, "__name__", str(tp)))


def _show(value: Any) -> str:
    return _escape(repr(value))


def _escape(text: str) -> str:
    """Braces would read as template fields: a ``SettingError`` message is a ``str.format`` template."""
    return text.replace("{", "{{").replace("}", "}}")


def _check_field(f: dataclasses.Field, value: Any) -> None:
    if value is None:
        return
    meta = f.metadata
    choices = meta.get("choices")
    if choices is not None:
        valid = choices() if callable(choices) else choices
        if not isinstance(valid, Container):  # (a generator: read once)
            valid = tuple(valid)
        if value not in valid:
            raise SettingError(f.name, "{0} must be one of " + ", ".join(map(str, valid)) + ", got " + _show(value))
    for key, test, word in (("gt", lambda v, b: v > b, ">"), ("ge", lambda v, b: v >= b, ">="),
                            ("lt", lambda v, b: v < b, "<"), ("le", lambda v, b: v <= b, "<=")):  # fmt: skip
        bound = meta.get(key)
        if bound is not None and isinstance(value, (int, float)) and not test(value, bound):
            raise SettingError(f.name, "{0} must be " + f"{word} {bound:g}, got " + _show(value))


def option_fields(cls: type, exclude: Iterable[str] = ()) -> list[dataclasses.Field]:
    """The fields of a settings class, in declaration order, without ``exclude``."""
    skip = set(exclude)
    return [f for f in dataclasses.fields(cls) if f.name not in skip]


def default_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not _NO_DEFAULT:
        return f.default_factory()
    return None if f.default is _NO_DEFAULT else f.default


def from_mapping(
    cls: type,
    data: Mapping[str, Any],
    *,
    fixed: Mapping[str, Any] | None = None,
    exclude: Iterable[str] = (),
    name: Callable[[str], str] = str,
    source: str = "",
) -> Any:
    """Build ``cls`` from a mapping (a YAML section), with ``fixed`` fields set by the caller.

    Keys outside the class's fields (or in ``exclude``, the fields the caller sets itself) are
    an error naming the key, with the closest valid one.

    Raises:
        SettingError: an unknown key, a bad value or a broken rule; rendered with ``name`` and
            prefixed with ``source`` (``"pipeline.yaml: search.trials must be > 0, got 0"``).
    """
    prefix = _escape(source)
    if not isinstance(data, Mapping):
        raise SettingError((), f"{prefix}expected a mapping, got {_show(data)}")
    allowed = [f.name for f in option_fields(cls, exclude)]
    for key in data:
        if key not in allowed:
            hint = _escape(did_you_mean(str(key), allowed))
            raise SettingError(name(str(key)), f"{prefix}unknown key {{0!r}}{hint}")
    try:
        return cls(**{**dict(fixed or {}), **dict(data)})
    except SettingError as e:
        raise SettingError(tuple(name(f) for f in e.fields), prefix + e.template) from None


def did_you_mean(key: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a close match, else `` (valid: a, b, c)``."""
    options = [str(o) for o in options]
    close = difflib.get_close_matches(key, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(options)})"


def yaml_scalar(value: Any) -> str:
    """One YAML scalar (or flow collection) as it would be written in a config file."""
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def yaml_lines(
    cls: type, values: Mapping[str, Any] | None = None, *, exclude: Iterable[str] = (), indent: int = 2
) -> list[str]:
    """``key: value  # help`` lines of a section: the class's defaults, with ``values`` over them."""
    values = values or {}
    rows = []
    for f in option_fields(cls, exclude):
        value = values.get(f.name, default_of(f))
        rows.append((f"{' ' * indent}{f.name}: {yaml_scalar(value)}", f.metadata.get("help", "")))
    width = max((len(r[0]) for r in rows), default=0)
    return [f"{text:<{width}}  # {help_}" if help_ else text for text, help_ in rows]


def parse_value(text: str) -> Any:
    """A command-line value as YAML reads it: ``"64"`` -> 64, ``"0.5"`` -> 0.5, ``"true"`` -> True,
    ``"null"`` -> None; anything else (and anything that is not a scalar) stays the string."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, (int, float, bool, str)) else text


def parse_assignments(items: Iterable[str] | None, flag: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values through ``parse_value``).

    Raises:
        SettingError: an item without ``=`` or without a key, naming ``flag``.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingError(flag, "{0} expects KEY=VALUE, got " + _show(item))
        out[key.strip()] = parse_value(value.strip())
    return out
