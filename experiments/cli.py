"""RunConfig from the command line and TOML files.

One flag per RunConfig field, built from the field's own declaration (common/config.py's ``knob``: help, group,
choices, spellings), in argparse groups as timm's train.py has them; flag names follow timm's where one exists
(``--amp-dtype``, ``--channels-last``, ``--grad-accum-steps``, ``-j/--workers``, ``--pin-mem``,
``--torchcompile-mode``, ``--grad-checkpointing``). Defaults are left unset on the parser, so a ``--config``
file's values stay unless a flag overrides them; the help shows RunConfig's default.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

from common import config as cfg
from common.config import RunConfig, knob_of
from common.errors import ConfigError
from common.workloads import workload_for

FRAMEWORK_NAMES = {"torch": "torch", "jax": "JAX"}


def flags_of(f: Field) -> tuple[str, ...]:
    """A RunConfig field's flag spellings: its declared ones (timm's where it has one), else --field-name."""
    return knob_of(f).flags or ("--" + f.name.replace("_", "-"),)


def help_of(f: Field | str, default: bool = True) -> str:
    """A field's help as --help shows it: the framework it alone applies to, and RunConfig's default unless the help
    states it in words (None: unset). ``default=False``: for a command's own flag of the same meaning and another
    default (loader-bench's --prefetch)."""
    f = f if isinstance(f, Field) else next(g for g in fields(RunConfig) if g.name == f)
    declared = knob_of(f)
    notes = []
    if set(declared.frameworks) != set(cfg.FRAMEWORKS):
        notes.append(f"{', '.join(FRAMEWORK_NAMES[name] for name in declared.frameworks)} only")
    if default and f.default is not None and "default" not in declared.help:
        notes.append(f"default: {f.default}")
    return f"{declared.help} ({'; '.join(notes)})" if notes else declared.help


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field, in its declared group (test hooks hidden); defaults unset so a --config file's
    values stay."""
    parser.add_argument("--config", default=None, help="TOML file with RunConfig keys (flags override it)")
    groups = {title: parser.add_argument_group(title) for title in cfg.GROUPS}
    for f in fields(RunConfig):
        group = knob_of(f).group
        if group == cfg.TEST_HOOKS:
            _add(parser, f, argparse.SUPPRESS)
        else:
            _add(groups[group], f, help_of(f))


def _add(parser: Any, f: Field, text: str) -> None:
    declared = knob_of(f)
    if f.type == "bool":
        parser.add_argument(*flags_of(f), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
    else:
        choices = declared.allowed
        parser.add_argument(*flags_of(f), dest=f.name, default=None, type=_parser_for(f.type), choices=choices,
                            metavar=None if choices else declared.metavar or f.name.upper(), help=text)


def _parser_for(type_text: str) -> Any:
    if type_text.startswith("int"):
        return _optional(int)
    if type_text.startswith("float"):
        return _optional(float) if "None" in type_text else float  # "none" unsets an optional one (a TOML value)
    return _optional(str)


def _optional(kind: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def _steps_or_epochs(given: dict[str, Any]) -> dict[str, Any]:
    """Giving one of steps and epochs unsets the other (RunConfig needs exactly one)."""
    if "steps" in given and "epochs" not in given:
        given["epochs"] = None
    if "epochs" in given and "steps" not in given:
        given["steps"] = None
    return given


def load_toml(path: str | Path) -> RunConfig:
    """A RunConfig from a TOML file; sections ([optimizer], [techniques], ...) are only grouping, so one key set in
    two places (two sections, or a section and the top level) is refused, naming both: neither would be sure to win."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder, not a TOML file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return RunConfig.from_dict(_steps_or_epochs(toml_values(path)))


def toml_values(path: Path) -> dict[str, Any]:
    """The RunConfig keys a TOML file sets (``load_toml``'s checks), by field name."""
    try:
        values = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line}); "
                          f"TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}
    for place, key, value in _entries(values):
        name = key.replace("-", "_")
        if name in flat:
            raise ConfigError(f"config file {path} sets {name} twice: {where[name]} and {place}; keep one")
        flat[name], where[name] = value, place
    return flat


def _entries(values: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(where, key, value) of every key of a TOML file: at the top level, or in a section ([optimizer])."""
    entries = []
    for key, value in values.items():
        if isinstance(value, dict):
            entries += [(f"[{key}] {k}", k, v) for k, v in value.items()]
        else:
            entries.append((f"the top level's {key}", key, value))
    return entries


def config_from_args(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    base = load_toml(args.config) if getattr(args, "config", None) else RunConfig()
    given = {f.name: getattr(args, f.name) for f in fields(RunConfig) if getattr(args, f.name, None) is not None}
    merged = {**_steps_or_epochs(given), **overrides}
    return base.replace(**with_family_source(merged, base))


def given_keys(args: argparse.Namespace) -> set[str]:
    """The RunConfig fields the user set, by a flag or in the --config file (a command may default the others
    differently from RunConfig, as infer does for a text model's batching)."""
    flags = {f.name for f in fields(RunConfig) if getattr(args, f.name, None) is not None}
    config = getattr(args, "config", None)
    return flags | (set(toml_values(Path(config))) if config else set())


def with_family_source(changes: dict[str, Any], base: RunConfig) -> dict[str, Any]:
    """A text model reads the text source unless a source was given (an image source is the default of all
    others): ``--model text-tiny`` alone is a complete run."""
    model = changes.get("model", base.model)
    if "source" not in changes and workload_for(model).family == "text" and base.source not in cfg.TEXT_SOURCES:
        return {**changes, "source": "text"}
    return changes
