"""``twinrun`` (= ``python -m experiments``): the driver's commands.

Bad input ends in one line naming it and exit status 2, never a traceback: argparse's own errors, a
TwinrunError (ConfigError, DataError) raised by a command, and an OSError (a file that cannot be read or
written, a full disk). Ctrl-C ends in one line and status 130; the rows already stored are kept, so the same
command run again resumes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from types import ModuleType
from typing import NoReturn

from common.errors import TwinrunError
from experiments.commands import (
    compare,
    diagnose,
    infer,
    ladder,
    loader_bench,
    overhead,
    parity,
    report,
    run,
    sweep,
    train,
)
from experiments.execution.host import check_overrides
from experiments.execution.runner import install_signal_handlers

# command -> (module in experiments/commands/, help); each module has add_arguments(parser) and run(args) -> exit code
COMMANDS: dict[str, tuple[ModuleType, str]] = {
    "ladder": (ladder, "the case study: rungs x frameworks, side by side"),
    "sweep": (sweep, "one technique over several values, both frameworks"),
    "diagnose": (diagnose, "input-, compute- or overhead-bound? with the evidence"),
    "report": (report, "markdown report + plots of a results folder"),
    "compare": (compare, "two results folders, configuration by configuration, with intervals and verdicts"),
    "train": (train, "one framework's trainer in this process (the entry point under torchrun)"),
    "run": (run, "one configuration through both frameworks, paired"),
    "parity": (parity, "torch vs Flax on transferred weights: logits, statistics, gradients"),
    "loader-bench": (loader_bench, "loader images/s per framework and worker count"),
    "infer": (infer, "inference variants: latency p50/p99, throughput and accuracy, both frameworks"),
    "overhead": (overhead, "our trainer's step vs a minimal hand-written loop"),
}

DESCRIPTION = ("twinrun (= python -m experiments) trains the same models (ResNets, ViTs, text encoders) in PyTorch and "
               "in JAX, measured the same way, and compares them: step times, where the time goes, accuracy, "
               "inference.")
EPILOG = "Run 'twinrun COMMAND --help' for the options of one command."
INTERRUPTED = "interrupted; the rows already written are kept; run the same command again to resume"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and "(default: X)" after every flag's help that has a default worth showing:
    not None, False or SUPPRESS (the RunConfig flags default to None on purpose, so that a --config file's values
    stay; their help states RunConfig's default itself), and not when the help already speaks of its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
        if not shown or default is None or default is False or default is argparse.SUPPRESS or "default" in text:
            return text
        values = default if isinstance(default, list | tuple) else [default]
        value = " ".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in values)
        return f"{text} (default: {value.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """An argparse error in one line, naming the flag, with where the flags are listed (not the whole usage,
    which runs to forty lines for the commands with RunConfig flags)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _plain(text: str | None) -> str:
    """A module docstring as plain text for --help: reST's double backticks dropped."""
    return (text or "").replace("``", "").strip()


def version() -> str:
    """The installed twinrun's version (pyproject.toml's), for --version."""
    try:
        return importlib.metadata.version("twinrun")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="twinrun", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"twinrun {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, text) in COMMANDS.items():
        module.add_arguments(commands.add_parser(name, help=text, description=_plain(module.__doc__) or text,
                                                 formatter_class=HelpFormatter))
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, parsed; a flag the command does not know is refused by that command's parser, so the
    line points to its own help ('twinrun ladder --help'), where the flag would be listed."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        action.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _os_error(exc: OSError) -> str:
    """One line naming the file(s) and the reason of an OSError (PermissionError, a full disk, ...)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    names = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
    return f"{' -> '.join(names)}: {reason}" if names else reason


def _one_line(text: str) -> str:
    """An error's text on one line: a reason quoted from a library can span several (tarfile lists each method)."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def main(argv: list[str] | None = None) -> int:
    prog = "twinrun"
    install_signal_handlers()  # SIGTERM ends the driver like Ctrl-C: workers stopped, temporary folders removed
    try:
        args = parse(argv)
        prog = f"twinrun {args.command}"
        check_overrides()  # a malformed TWINRUN_GPU_CAPABILITY, before anything runs
        code = COMMANDS[args.command][0].run(args)
        return code if isinstance(code, int) else 0
    except TwinrunError as exc:
        print(f"{prog}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: error: {_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: {INTERRUPTED}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
