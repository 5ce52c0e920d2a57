"""Command-line flags generated from a run configuration's dataclass fields: one definition per setting.

Each field that is a flag carries `field(metadata=flag(help, ...))`; `add_flags` turns the fields of a
dataclass (its bases' first) into argparse arguments whose dest, default, type and choices are the
field's: `--name-with-dashes` for `name_with_dashes`, `Literal[...]` as choices, `X | None` as an optional
X, a `bool` defaulting to False as a switch and one defaulting to True as `--no-name`, `const` for a flag
whose value may be left out (`--resume [CHECKPOINT]`), `append` for a repeatable one (`--set`). `to_argv`
writes a configuration back as the command line that parses to it, from the same metadata.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Callable, Literal

_NO_CONST = object()


@dataclass(frozen=True)
class Flag:
    help: str
    names: tuple[str, ...] = ()          # default: --field-name (--no-field-name for a True bool)
    metavar: str | None = None
    const: Any = _NO_CONST               # the value of the bare flag: the value becomes optional
    parse: Callable[[str], Any] | None = None  # text -> value, for values argparse cannot type
    append: bool = False                 # repeatable; the values are collected in a list
    group: str | None = None             # the --help section


def flag(help: str, **options: Any) -> dict[str, Flag]:
    """Field metadata marking a run-config field as a flag: `field(default=..., metadata=flag("..."))`."""
    return {"flag": Flag(help, **options)}


def int_list(text: str) -> list[int]:
    """A comma-separated list of integers (`--stage-steps 200,400`)."""
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 200,400") from None


def finite_float(text: str) -> float:
    """A float that is a number: argparse's float takes 'nan' and 'inf', which no setting means."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _unwrap_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _default(field: dataclasses.Field) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return MISSING


def _flags(config_class: type) -> list[tuple[dataclasses.Field, Flag, Any, Any, tuple[str, ...]]]:
    """(field, its Flag, its type without `| None`, its default, its option names) of every flag field."""
    hints = typing.get_type_hints(config_class)
    found = []
    for field in dataclasses.fields(config_class):
        spec: Flag | None = field.metadata.get("flag")
        if spec is None:
            continue
        default, kind, dashed = _default(field), _unwrap_optional(hints[field.name]), field.name.replace("_", "-")
        switch_off = kind is bool and default is True
        found.append((field, spec, kind, default, spec.names or (f"--no-{dashed}" if switch_off else f"--{dashed}",)))
    return found


def add_flags(parser: argparse.ArgumentParser, config_class: type) -> None:
    """The flags of every field of `config_class` that carries `flag(...)` metadata."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field, spec, kind, default, names in _flags(config_class):
        target = parser if spec.group is None else groups.setdefault(spec.group, parser.add_argument_group(spec.group))
        options: dict[str, Any] = {"dest": field.name, "help": spec.help}
        if kind is bool:
            options["action"] = "store_false" if default is True else "store_true"
            options["default"] = default
        else:
            if default is MISSING:
                options["required"] = True
            else:
                options["default"] = default
            if spec.append:
                options["action"] = "append"
                kind = typing.get_args(kind)[0] if typing.get_args(kind) else str
            if typing.get_origin(kind) is Literal:
                options["choices"] = typing.get_args(kind)
            elif spec.parse is not None:
                options["type"] = spec.parse
            elif kind is float:
                options["type"] = finite_float
            elif kind in (int, Path):
                options["type"] = kind
            if spec.const is not _NO_CONST:
                options.update(nargs="?", const=spec.const)
            if spec.metavar is not None:
                options["metavar"] = spec.metavar
        target.add_argument(*names, **options)


def values(namespace: argparse.Namespace, config_class: type) -> dict[str, Any]:
    """The parsed values of `config_class`'s flag fields (a fresh list for every repeatable flag)."""
    return {f.name: getattr(namespace, f.name) for f in dataclasses.fields(config_class) if "flag" in f.metadata}


def to_argv(config: Any) -> list[str]:
    """The command line that parses back to `config` (`parse(TASK, to_argv(cfg)) == cfg`): its flag fields that
    differ from their defaults, under their first option name."""
    argv: list[str] = []
    for field, spec, kind, default, names in _flags(type(config)):
        value = getattr(config, field.name)
        if default is not MISSING and value == default:
            continue
        if kind is bool:
            argv.append(names[0])
        elif value is None:
            raise ValueError(f"{field.name}=None has no command line: its flag's default is {default!r}")
        elif spec.append:
            argv += [part for item in value for part in (names[0], str(item))]
        elif spec.const is not _NO_CONST and value == spec.const:
            argv.append(names[0])
        elif isinstance(value, (list, tuple)):  # parsed from one comma-separated text (int_list, OPS,MAGNITUDE)
            argv += [names[0], ",".join(map(str, value))]
        else:
            argv += [names[0], str(value)]
    return argv
