"""The one settings loader (modelpool_contract.settings): flags derived from the fields, the environment
under the program's prefix, env < flag, one-line errors and exit 2; and the three programs built on it
(every field of each is a flag, its environment variable is its prefix and name)."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from model_server.config import COMMAND_LINE as SERVER_CLI
from model_server.config import ServerConfig
from modelpool_contract.exits import EXIT_CONFIG
from modelpool_contract.settings import (
    CommandLine,
    ConfigError,
    Flag,
    build_parser,
    env_name,
    flag_name,
    load,
    load_or_exit,
)
from modelpool_gateway.config import COMMAND_LINE as GATEWAY_CLI
from modelpool_gateway.config import GatewaySettings
from modelpool_operator.main import COMMAND_LINE as OPERATOR_CLI
from modelpool_operator.settings import OperatorConfig


class Toy(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOY_", extra="forbid", frozen=True)

    name: str = Field(description="required")
    max_items: int = Field(default=3, ge=1, description="a bound")
    verbose_log: bool = Field(default=False, description="a switch")
    zones: Annotated[tuple[str, ...], NoDecode] = Field(default=(), description="comma-separated")
    mode: str = Field(default="a", description="a or b (100% one of them)")

    @field_validator("zones", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return tuple(v for v in value.split(",") if v) if isinstance(value, str) else value


PLAIN = CommandLine(prog="toy", description="a toy")
CUSTOM = CommandLine(
    prog="toy",
    description="a toy",
    flags={
        "zones": [
            Flag(names=("-z", "--zone"), append=True, group="zones"),
            Flag(names=("--all-zones",), const=(), group="zones"),
        ],
        "mode": [Flag(names=("--mode",), choices=("a", "b"))],
    },
)


def test_every_field_is_a_flag_and_booleans_take_no_value() -> None:
    toy, _ = load(Toy, ["--name", "x", "--max-items", "7", "--verbose-log", "--zones", "a,b"], PLAIN)
    assert (toy.name, toy.max_items, toy.verbose_log, toy.zones) == ("x", 7, True, ("a", "b"))
    assert load(Toy, ["--name", "x"], PLAIN)[0] == Toy(name="x")


def test_help_shows_each_fields_description() -> None:
    text = build_parser(Toy, PLAIN).format_help()
    assert "--max-items MAX_ITEMS" in text and "a bound" in text and "(100% one of them)" in text


def test_the_environment_is_read_under_the_prefix_and_a_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_NAME", "env")
    monkeypatch.setenv("TOY_MAX_ITEMS", "5")
    monkeypatch.setenv("TOY_ZONES", "e1,e2")
    toy, _ = load(Toy, ["--max-items", "9"], PLAIN)
    assert (toy.name, toy.max_items, toy.zones) == ("env", 9, ("e1", "e2"))


def test_renamed_repeatable_constant_and_exclusive_flags() -> None:
    assert load(Toy, ["--name", "x", "-z", "a", "--zone", "b"], CUSTOM)[0].zones == ("a", "b")
    assert load(Toy, ["--name", "x", "--all-zones"], CUSTOM)[0].zones == ()
    with pytest.raises(ConfigError, match="not allowed with argument"):
        load(Toy, ["--name", "x", "-z", "a", "--all-zones"], CUSTOM)
    with pytest.raises(ConfigError, match="invalid choice"):
        load(Toy, ["--name", "x", "--mode", "c"], CUSTOM)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "invalid configuration: --name is required (or set TOY_NAME)"),
        (
            ["--name", "x", "--max-items", "0"],
            "invalid configuration: --max-items (TOY_MAX_ITEMS): Input should be greater than or equal to 1",
        ),
        (["--name", "x", "--bogus"], "invalid arguments: unrecognized arguments: --bogus"),
    ],
)
def test_errors_are_one_line_naming_the_flag_and_the_variable(argv: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(Toy, argv, PLAIN)
    assert str(err.value) == expected


def test_invalid_configuration_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        load_or_exit(Toy, ["--max-items", "x"], PLAIN)
    assert exit_.value.code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("toy: invalid configuration: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("model", "cli", "prefix"),
    [
        (ServerConfig, SERVER_CLI, "MODELPOOL_"),
        (GatewaySettings, GATEWAY_CLI, "MODELPOOL_GATEWAY_"),
        (OperatorConfig, OPERATOR_CLI, "MODELPOOL_OPERATOR_"),
    ],
)
def test_each_program_has_a_flag_for_every_field_under_its_prefix(
    model: type[BaseSettings], cli: CommandLine, prefix: str
) -> None:
    parser = build_parser(model, cli)
    dests = {action.dest for action in parser._actions}
    assert set(model.model_fields) <= dests
    options = {option for action in parser._actions for option in action.option_strings}
    for name in model.model_fields:
        assert env_name(model, name) == prefix + name.upper()
        if name not in cli.flags:
            assert flag_name(name) in options, name
