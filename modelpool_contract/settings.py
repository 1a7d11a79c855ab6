"""One way for every program of the project to load its settings: a pydantic-settings model, read from its
environment and its command line.

The operator (``OperatorConfig``), the server (``ServerConfig``) and the gateway (``GatewaySettings``) each
keep their fields in their own settings class (a ``BaseSettings`` with its ``env_prefix``); this module
turns such a class into a command line and loads it, the same way for all three:

* every field ``x_y`` is the flag ``--x-y`` and the environment variable ``<PREFIX>X_Y`` (pydantic-settings
  reads the environment); a program may give a field other flag names, a repeatable flag, a flag that sets
  a constant, or mutually exclusive flags (``Flag``), and may add flags that are not settings;
* a flag's value is read exactly as its environment variable is (the model's own validators parse it: a
  comma-separated list, a number, ...); a boolean field is a flag without a value that sets it true;
* precedence: default < environment < command line (flags are the model's init arguments);
* anything invalid is a ``ConfigError`` whose text is one line naming the flag and its variable
  (``--port (MODELPOOL_PORT): Input should be ...``); ``load_or_exit`` prints it after the program's
  name and exits 2 (``exits.EXIT_CONFIG``).

pydantic-settings' own command line (``CliSettingsSource``) is not used: flag names other than the field's
(``--namespace`` for ``namespaces``) would need validation aliases, which rename the environment variables
too; mutually exclusive flags need nested models, which would change the settings' shape; and its errors
span several lines.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from modelpool_contract.exits import EXIT_CONFIG

S = TypeVar("S", bound=BaseSettings)

_NO_CONST = object()


class ConfigError(Exception):
    """Invalid configuration; ``str(exc)`` is the one-line reason printed before exit code 2."""


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a field, where the plain ``--x-y VALUE`` does not fit.

    ``names``: the flag's spellings (default ``--x-y``); ``append``: repeatable, the values form a list;
    ``const``: the flag takes no value and sets the field to this; ``choices``, ``metavar`` and ``help``
    as argparse has them (``help`` defaults to the field's description); ``group``: flags of the same
    group exclude each other."""

    names: tuple[str, ...] = ()
    append: bool = False
    const: Any = _NO_CONST
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    help: str | None = None
    group: str | None = None


@dataclass(frozen=True)
class CommandLine:
    """A program's command line over its settings class.

    ``flags``: per field, the flags that replace its plain one (several for one field: e.g. ``-n NS``
    and ``--all-namespaces``); ``extra``: adds arguments that are not settings (they come back in the
    parsed namespace under their own ``dest``, never passed to the model)."""

    prog: str
    description: str
    flags: Mapping[str, Sequence[Flag]] = field(default_factory=dict)
    extra: Callable[[argparse.ArgumentParser], None] | None = None


def flag_name(field_name: str) -> str:
    """The flag of field ``x_y``: ``--x-y``."""
    return "--" + field_name.replace("_", "-")


def env_name(model: type[BaseSettings], field_name: str) -> str:
    """The environment variable of a field: the model's prefix and the field's name in capitals."""
    return f"{model.model_config.get('env_prefix', '')}{field_name}".upper()


def build_parser(model: type[BaseSettings], cli: CommandLine) -> argparse.ArgumentParser:
    """An argparse parser with one flag per field (``dest`` = the field's name) unless ``cli`` says
    otherwise; a flag not given leaves ``None`` (the environment or the default applies)."""
    parser = argparse.ArgumentParser(prog=cli.prog, description=cli.description)
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for name, info in model.model_fields.items():
        flags = cli.flags.get(name) or (Flag(),)
        for flag in flags:
            target: Any = parser
            if flag.group is not None:
                if flag.group not in groups:
                    groups[flag.group] = parser.add_mutually_exclusive_group()
                target = groups[flag.group]
            _add(target, name, flag, info.annotation is bool, flag.help or info.description)
    if cli.extra is not None:
        cli.extra(parser)
    return parser


def _add(target: Any, name: str, flag: Flag, is_bool: bool, help_text: str | None) -> None:
    names = flag.names or (flag_name(name),)
    # argparse formats help with "%": a description's own "%" must stay one.
    help_text = help_text.replace("%", "%%") if help_text else help_text
    common: dict[str, Any] = {"dest": name, "help": help_text, "default": None}
    if flag.const is not _NO_CONST:
        target.add_argument(*names, action="store_const", const=flag.const, **common)
    elif is_bool:
        target.add_argument(*names, action="store_const", const=True, **common)
    elif flag.append:
        target.add_argument(*names, action="append", metavar=flag.metavar or "VALUE", **common)
    else:
        metavar = flag.metavar or (None if flag.choices else name.upper())
        target.add_argument(*names, choices=flag.choices, metavar=metavar, **common)


def given(model: type[BaseSettings], namespace: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line set (the flags given), as the model's init arguments."""
    return {k: v for k, v in vars(namespace).items() if k in model.model_fields and v is not None}


def validate(model: type[S], values: Mapping[str, Any], cli: CommandLine | None = None) -> S:
    """``model(**values)`` over its environment; a ``ConfigError`` with one line when invalid."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise ConfigError(one_line(model, exc, cli)) from None


def load(model: type[S], argv: Sequence[str] | None, cli: CommandLine) -> tuple[S, argparse.Namespace]:
    """Parse ``argv`` (None: ``sys.argv[1:]``) over the model's environment: the settings, and the parsed
    namespace (for the ``extra`` arguments). Raises ``ConfigError`` (one line) when anything is invalid."""
    parser = build_parser(model, cli)

    def fail(message: str) -> NoReturn:
        raise ConfigError(f"invalid arguments: {message}")

    parser.error = fail  # type: ignore[method-assign]
    namespace = parser.parse_args(list(argv) if argv is not None else None)
    return validate(model, given(model, namespace), cli), namespace


def load_or_exit(
    model: type[S], argv: Sequence[str] | None, cli: CommandLine
) -> tuple[S, argparse.Namespace]:
    """``load``, or the one-line reason on stderr after the program's name and exit 2."""
    try:
        return load(model, argv, cli)
    except ConfigError as exc:
        exit_invalid(cli.prog, exc)


def exit_invalid(prog: str, exc: ConfigError) -> NoReturn:
    print(f"{prog}: {exc}", file=sys.stderr)
    sys.exit(EXIT_CONFIG)


def one_line(model: type[BaseSettings], exc: ValidationError, cli: CommandLine | None = None) -> str:
    """Every error of ``exc`` on one line, each naming its flag and its variable."""
    parts = []
    for err in exc.errors():
        message = str(err["msg"]).removeprefix("Value error, ")
        if not err["loc"]:  # a check across fields: its message names them
            parts.append(message)
            continue
        name, *rest = (str(x) for x in err["loc"])
        where = _flag_of(name, cli) + "".join(f"[{x}]" for x in rest)
        if err["type"] == "missing":
            parts.append(f"{where} is required (or set {env_name(model, name)})")
        else:
            parts.append(f"{where} ({env_name(model, name)}): {message}")
    return "invalid configuration: " + "; ".join(parts)


def _flag_of(name: str, cli: CommandLine | None) -> str:
    """The first long flag of a field (its plain one unless the command line renames it)."""
    for flag in (cli.flags.get(name) or ()) if cli is not None else ():
        if flag.const is _NO_CONST:
            return next((n for n in flag.names if n.startswith("--")), flag_name(name))
    return flag_name(name)
