"""Nonsense input is refused by name, in one line, with no traceback, before any run starts; --help is complete.

Everything here is in-process and fast: each refusal happens while parsing the flags or building the
RunConfig, before a data set, weights file or subprocess is made.
"""

from __future__ import annotations

import argparse

import pytest

from common.cli import add_config_arguments, config_from_args, load_toml
from common.config import RunConfig
from common.errors import ConfigError
from common.store import writable_folder
from experiments.__main__ import COMMANDS, build_parser, main
from experiments.catalog.sweeps import SWEEPS, Sweep, checked_values
from experiments.commands import report

HIDDEN_FLAGS = ("--fail-after-step", "--inject-inf-at-step", "--inject-failure")


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """stderr of a command refused with exit status 2, by argparse (SystemExit) or by main."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_floats_are_refused_by_name(value, tmp_path, capsys):
    err = _one_line(_refused(capsys, ["run", f"--lr={value}", "--out", str(tmp_path)]))
    assert f"lr must be a finite number, got {float(value)}" in err
    with pytest.raises(ConfigError, match="momentum must be a finite number"):
        RunConfig(momentum=float(value))
    with pytest.raises(ConfigError, match="read_latency_ms must be a finite number"):
        RunConfig(read_latency_ms=float(value))


@pytest.mark.parametrize("command", ["ladder", "run", "infer", "diagnose", "overhead", "loader-bench"])
@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_timeout_must_be_positive(command, value, capsys):
    err = _one_line(_refused(capsys, [command, f"--timeout={value}"]))
    assert "--timeout" in err and "positive" in err


@pytest.mark.parametrize("argv,flag", [
    (["ladder", "--devices", "0"], "--devices"),
    (["sweep", "workers", "--devices", "-1"], "--devices"),
    (["ladder", "--processes", "0"], "--processes"),
    (["ladder", "--repeats", "0"], "--repeats"),
    (["ladder", "--steps", "0"], "--steps"),
    (["ladder", "--workers", "-1"], "--workers"),
    (["infer", "--train-epochs", "-1"], "--train-epochs"),
    (["infer", "--calls", "0"], "--calls"),
    (["infer", "--warmup", "-1"], "--warmup"),
    (["infer", "--throughput-batches", "32", "0"], "--throughput-batches"),
    (["infer", "--calibration-batches", "0"], "--calibration-batches"),
    (["parity", "--width", "0"], "--width"),
    (["parity", "--batch-size", "0"], "--batch-size"),
    (["parity", "--stem", "tiny"], "--stem"),
    (["loader-bench", "--batches", "1"], "--batches"),
    (["loader-bench", "--source", "imagenet"], "--source"),
])
def test_command_flags_refuse_nonsense_by_name(argv, flag, capsys):
    err = _one_line(_refused(capsys, argv))
    assert f"argument {flag}" in err or f"/{flag}" in err, err


def test_data_with_the_synthetic_source_is_refused(tmp_path, capsys):
    err = _one_line(_refused(capsys, ["run", "--source", "synthetic", "--data", str(tmp_path / "cifar.tar.gz"),
                                      "--out", str(tmp_path / "out")]))
    assert "--data is read by the CIFAR sources; source synthetic generates its images" in err


@pytest.mark.parametrize("flag,value", [("--steps", "0"), ("--steps", "-3"), ("--epochs", "0")])
def test_zero_steps_or_epochs_are_named(flag, value, tmp_path, capsys):
    err = _one_line(_refused(capsys, ["run", flag, value, "--out", str(tmp_path)]))
    assert f"{flag[2:]} must be positive, got {value}" in err
    assert "profile_steps" not in err


def test_a_bad_sweep_value_is_named_with_its_sweep():
    base = RunConfig(batch_size=64, steps=8, epochs=None)
    with pytest.raises(ConfigError, match="accumulation value '0': k must be a positive divisor of the batch size 64"):
        checked_values(SWEEPS["accumulation"], ["1", "0"], base, ("torch", "jax"))
    with pytest.raises(ConfigError, match="scaling value '0': devices must be positive"):
        checked_values(SWEEPS["scaling"], ["0"], base, ("torch",))

    def breaks(value: str, base: RunConfig, framework: str) -> dict:
        return {"batch_size": 64 // int(value)}

    odd = Sweep("odd", "a knob", lambda base, cuda: ["1"], breaks)
    with pytest.raises(ConfigError, match="odd value '0': ZeroDivisionError"):
        checked_values(odd, ["0"], base, ("torch",))


def test_a_toml_value_of_the_wrong_type_is_named(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('batch_size = "eight"\n')
    err = _one_line(_refused(capsys, ["run", "--config", str(path), "--out", str(tmp_path / "out")]))
    assert "config key batch_size must be an integer, got 'eight' (str)" in err
    for values, message in [({"lr": "fast"}, "config key lr must be a number"),
                            ({"batch_size": True}, "config key batch_size must be an integer, got True"),
                            ({"png": 1}, "config key png must be true or false"),
                            ({"data": 3}, "config key data must be a string or none")]:
        with pytest.raises(ConfigError, match=message):
            RunConfig.from_dict(values)
    assert RunConfig.from_dict({"width": 1, "eval_batches": None}).width == 1.0  # an int is a fine float


def test_a_toml_with_steps_only_loads(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("steps = 3\n[optimizer]\nlr = 1\n")
    config = load_toml(path)
    assert (config.steps, config.epochs, config.lr) == (3, None, 1.0)
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert config_from_args(parser.parse_args(["--config", str(path)])).steps == 3
    assert config_from_args(parser.parse_args(["--config", str(path), "--epochs", "2"])).epochs == 2


@pytest.mark.parametrize("argv", [["diagnose"], ["overhead"], ["train", "--framework", "torch"]])
def test_an_unwritable_out_is_refused_before_any_run(argv, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    err = _one_line(_refused(capsys, [*argv, "--out", str(tmp_path / "afile" / "x")]))
    assert "--out" in err and "cannot write there" in err and "afile is a file" in err
    err = _one_line(_refused(capsys, [*argv, "--out", str(tmp_path / "afile")]))
    assert "is a file, not a folder" in err


@pytest.mark.parametrize("argv, flag", [
    (["ladder", "--data", "unread.tar.gz", "--results"], "--results"),
    (["sweep", "workers", "--data", "unread.tar.gz", "--results"], "--results"),
    (["run", "--source", "synthetic", "--out"], "--out"),
    (["infer", "--source", "synthetic", "--train-epochs", "0", "--out"], "--out"),
    (["loader-bench", "--source", "synthetic", "--out"], "--out")])
def test_an_unwritable_results_folder_is_refused_before_any_run(argv, flag, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    err = _one_line(_refused(capsys, [*argv, str(tmp_path / "afile" / "x")]))
    assert "cannot write there" in err and "afile is a file" in err
    assert writable_folder(tmp_path / "a" / "b", flag).is_dir()


def test_an_os_error_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    def denied(args: argparse.Namespace) -> int:
        raise PermissionError(13, "Permission denied", str(tmp_path / "runs.jsonl"))

    monkeypatch.setattr(report, "run", denied)
    err = _one_line(_refused(capsys, ["report", str(tmp_path)]))
    assert err == f"twinrun report: error: {tmp_path / 'runs.jsonl'}: Permission denied"


def test_ctrl_c_is_one_line_and_status_130(tmp_path, monkeypatch, capsys):
    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "run", interrupted)
    assert main(["report", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert _one_line(err) == ("twinrun report: interrupted; the rows already written are kept; run the same command "
                              "again to resume")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_help_is_complete_and_hides_the_test_hooks():
    top = build_parser().format_help()
    assert "``" not in top and "twinrun COMMAND --help" in top
    subparsers = _subparsers()
    assert set(subparsers) == set(COMMANDS)
    for name, parser in subparsers.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            assert action.help and action.help.strip(), f"twinrun {name} {action.option_strings or action.dest}"
        text = parser.format_help()
        for flag in HIDDEN_FLAGS:
            assert flag not in text, f"twinrun {name} shows {flag}"
        assert "(default: None)" not in text and "``" not in text, name
    ladder = " ".join(subparsers["ladder"].format_help().split())
    assert "{cpu,tiny,article}" in ladder and "(default: cpu)" in ladder and "(default: 1800)" in ladder
    assert "plan:" in ladder and "output:" in ladder
    run = " ".join(subparsers["run"].format_help().split())
    assert "base learning rate (default: 0.1)" in run  # RunConfig's default, stated once
    # hidden, still accepted
    assert build_parser().parse_args(["ladder", "--inject-failure", "baseline:torch"]).inject_failure
    assert build_parser().parse_args(["run", "--fail-after-step", "2"]).fail_after_step == 2
