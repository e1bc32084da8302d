"""Configuration dataclasses as the one source of options.

A field declared with `option(...)` carries its help, its choices (an Enum or a Literal type) and the
environment variable that may set it. From that declaration alone:

    add_flags(parser, TrainerConfig)      one CLI flag per option, nested configs included
    build(TrainerConfig, args, **fixed)   the config from the flags given, else the environment, else defaults
    resolve(args, *classes)               the same, merged into the command's namespace (beside its positionals)
    check_modes(cfg)                      in __post_init__: every Enum / Literal field holds one of its values

so a default, a help text or a choice is written once, beside the field, and never copied into a parser.
`env(name)` is the one place the FLYWHEEL_* overrides are read.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

_NO_DEFAULT = dataclasses.MISSING


def option(
    default: Any = _NO_DEFAULT,
    *,
    help: str,
    flag: str | None = None,
    env: str | None = None,
    cli: bool = True,
    default_factory: Any = _NO_DEFAULT,
    repr: bool | None = None,
) -> Any:
    """A config field that is also a CLI flag (`--name-with-dashes`, or `flag`), optionally set from `env`.
    cli=False: from the environment only (a secret: a flag would show it to every `ps` on the machine), and so
    never printed with its config either (repr defaults to cli). Without a default (nor an `env`), the flag is
    required."""
    meta = {"help": help, "flag": flag, "env": env, "cli": cli}
    repr = cli if repr is None else repr
    if default_factory is not _NO_DEFAULT:
        return dataclasses.field(default_factory=default_factory, metadata=meta, repr=repr)
    return dataclasses.field(default=default, metadata=meta, repr=repr)


def nested(factory, *, prefix: str = "") -> Any:
    """A nested config whose options become flags of the same command (their names prefixed, if given)."""
    return dataclasses.field(default_factory=factory, metadata={"nested": True, "prefix": prefix})


def env(name: str) -> str | None:
    """The value of an environment override, or None when it is unset or empty."""
    return os.environ.get(name) or None


# ----------------------------------------------------------------------------- types


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _base(tp):
    """`X | None` -> X."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def choices_of(tp) -> tuple | None:
    tp = _base(tp)
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tuple(m.value for m in tp)
    return None


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r} (1/0, true/false, yes/no, on/off)")


def _converter(tp):
    tp = _base(tp)
    if tp is bool:
        return _bool
    if typing.get_origin(tp) is Literal:
        kinds = {type(a) for a in typing.get_args(tp)}
        return kinds.pop() if len(kinds) == 1 else str
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    if tp in (int, float, str, Path):
        return tp
    raise TypeError(f"no CLI conversion for {tp!r}")


def check_modes(cfg) -> None:
    """Every Enum or Literal field holds one of its values (an Enum field also takes its value's string)."""
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        tp, value = _base(hints[f.name]), getattr(cfg, f.name)
        allowed = choices_of(tp)
        if allowed is None or value is None:
            continue
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            if not isinstance(value, tp):
                if value not in allowed:
                    raise ValueError(
                        f"{type(cfg).__name__}.{f.name} must be one of {', '.join(map(str, allowed))}, got {value!r}"
                    )
                setattr(cfg, f.name, tp(value))
        elif value not in allowed:
            raise ValueError(
                f"{type(cfg).__name__}.{f.name} must be one of {', '.join(map(str, allowed))}, got {value!r}"
            )


# ----------------------------------------------------------------------------- flags


def _options(cls, prefix: str = ""):
    """(dest, flag, field, type) of every option of cls and of its nested configs."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            yield from _options(_base(hints[f.name]), prefix + f.metadata["prefix"])
        elif "help" in f.metadata:
            name = f.metadata["flag"] or prefix + f.name.replace("_", "-")
            yield name.replace("-", "_"), "--" + name, f, hints[f.name]


def _default(f: dataclasses.Field):
    if f.default is not _NO_DEFAULT:
        return f.default
    if f.default_factory is not _NO_DEFAULT:
        return f.default_factory()
    return None


def add_flags(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One flag per option of cls (and its nested configs), its help showing the default and env var."""
    for dest, flag, f, tp in _options(cls):
        if dest in skip or not f.metadata["cli"]:
            continue
        default, meta = _default(f), f.metadata
        required = f.default is _NO_DEFAULT and f.default_factory is _NO_DEFAULT and not meta["env"]
        shown = default.value if isinstance(default, enum.Enum) else default
        text = meta["help"] + (f" [env {meta['env']}]" if meta["env"] else "")
        text += "" if required else f" (default: {shown})"
        if _base(tp) is bool:
            parser.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text
            )
            continue
        if typing.get_origin(_base(tp)) is list:  # a repeated flag: one item each time it is given
            (item,) = typing.get_args(_base(tp))
            parser.add_argument(
                flag, dest=dest, action="append", type=_converter(item), default=argparse.SUPPRESS, help=text
            )
            continue
        parser.add_argument(
            flag,
            dest=dest,
            type=_converter(tp),
            choices=[_converter(tp)(c) for c in choices] if (choices := choices_of(tp)) else None,
            required=required,
            default=argparse.SUPPRESS,  # absent from the namespace unless given: the config's default stands
            help=text,
        )


def build(cls, args: argparse.Namespace, prefix: str = "", **fixed):
    """cls from the flags given, else each option's environment variable, else its default; `fixed`
    (values the command worked out itself) win over all three."""
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in fixed:
            values[f.name] = fixed[f.name]
        elif f.metadata.get("nested"):
            values[f.name] = build(_base(hints[f.name]), args, prefix + f.metadata["prefix"])
        elif "help" in f.metadata:
            dest = (f.metadata["flag"] or prefix + f.name.replace("_", "-")).replace("-", "_")
            if hasattr(args, dest):
                values[f.name] = getattr(args, dest)
            elif f.metadata["env"] and env(f.metadata["env"]) is not None:
                values[f.name] = _converter(hints[f.name])(env(f.metadata["env"]))
    return cls(**values)


def resolve(args: argparse.Namespace, *classes) -> argparse.Namespace:
    """`args` with every option of `classes` resolved as build() does (the flag given, else its environment
    variable, else its default): for a command whose handlers read one namespace of positionals and options."""
    built = [build(cls, args) for cls in classes]
    options = {f.name: getattr(cfg, f.name) for cfg in built for f in dataclasses.fields(cfg)}
    return argparse.Namespace(**{**vars(args), **options})
