"""Nonsense input is refused by name, in one line, with no traceback, before any run starts; --help is complete.

Everything here is in-process and fast: each refusal happens while parsing the flags or building the
RunConfig, before a data set, weights file or subprocess is made.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from common.config import RunConfig
from common.errors import ConfigError
from experiments.__main__ import COMMANDS, build_parser, main
from experiments.catalog.sweeps import SWEEPS, Sweep, checked_values
from experiments.cli import add_config_arguments, config_from_args, load_toml
from experiments.commands import report
from experiments.execution.store import writable_folder

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


# -- issue 26: refused up front, by name, in one line, leaving nothing behind ----------------------------------------


def _no_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("a run started: the refusal came too late")


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if any run, or the initial weights' process, starts."""
    from experiments.commands import run as run_command
    from experiments.execution import paired

    monkeypatch.setattr(run_command, "run_framework", _no_run)
    monkeypatch.setattr(paired, "run_isolated", _no_run)


def test_a_malformed_simulated_gpu_capability_is_refused_before_any_run(tmp_path, monkeypatch, capsys, no_runs):
    """Item 3: TWINRUN_GPU_CAPABILITY=abc used to let the run finish, then fail in the host record."""
    from experiments.execution.host import detect

    monkeypatch.setenv("TWINRUN_GPU_CAPABILITY", "abc")
    err = _one_line(_refused(capsys, ["run", "--source", "synthetic", "--out", str(tmp_path / "out")]))
    assert "TWINRUN_GPU_CAPABILITY='abc' is not a CUDA compute capability" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="TWINRUN_GPU_CAPABILITY"):
        detect()
    for value, expected in (("8.0", "8.0"), ("none", None), ("12.0", "12.0")):
        monkeypatch.setenv("TWINRUN_GPU_CAPABILITY", value)
        assert detect().gpu_capability == expected and detect().to_dict()["simulated"]


def test_ladder_steps_with_to_accuracy_is_refused_by_name(tmp_path, capsys):
    """Item 4: --steps was dropped silently by a time-to-accuracy ladder (whole epochs, up to 5)."""
    for extra in (["--to-accuracy", "0.5"], ["--epochs", "2"]):
        err = _one_line(_refused(capsys, ["ladder", "--preset", "tiny", *extra, "--steps", "3", "--data",
                                          str(tmp_path / "unread.tar.gz"), "--results", str(tmp_path / "r")]))
        assert f"--steps does not combine with {extra[0]}" in err and "--epochs E" in err
    assert not (tmp_path / "r").exists()


def test_a_toml_key_set_in_two_sections_is_refused_naming_both(tmp_path, capsys):
    """Item 6: sections are only grouping, so the last of two values used to win silently."""
    path = tmp_path / "run.toml"
    path.write_text("[schedule]\nbatch_size = 32\n[loader]\nbatch_size = 64\n")
    err = _one_line(_refused(capsys, ["run", "--config", str(path), "--out", str(tmp_path / "out")]))
    assert "sets batch_size twice: [schedule] batch_size and [loader] batch_size" in err
    path.write_text("lr = 0.1\n[optimizer]\nlr = 0.2\n")
    with pytest.raises(ConfigError, match=r"sets lr twice: the top level's lr and \[optimizer\] lr"):
        load_toml(path)
    path.write_text("[loader]\nbatch-size = 8\nbatch_size = 16\n")
    with pytest.raises(ConfigError, match=r"batch_size twice: \[loader\] batch-size and \[loader\] batch_size"):
        load_toml(path)
    assert not (tmp_path / "out").exists()


def test_a_batch_larger_than_the_data_is_refused_before_anything_is_built(tmp_path, capsys, no_runs):
    """Item 8: -b 10000000 on 32 synthetic images built a 10-million-image eval split and hung."""
    from common.workloads import open_sources

    err = _one_line(_refused(capsys, ["run", "-b", "10000000", "--source", "synthetic", "--synthetic-size", "32",
                                      "--out", str(tmp_path / "out")]))
    assert "batch_size 10000000 x devices 1 is more than the 32 images of the synthetic source" in err
    with pytest.raises(ConfigError, match="batch_size 16 x devices 4 is more than the 32 images"):
        RunConfig(source="synthetic", synthetic_size=32, batch_size=16, devices=4)
    train, test = open_sources(RunConfig(source="synthetic", synthetic_size=32, batch_size=32))
    assert (len(train), len(test)) == (32, 32)  # the eval split never outgrows the data


def test_a_toml_file_that_is_not_utf8_or_is_a_folder_is_one_line(tmp_path, capsys):
    """Items 11 and 15: invalid UTF-8 raised UnicodeDecodeError; a folder was "not found"."""
    path = tmp_path / "run.toml"
    path.write_bytes(b"lr = 0.1\n# caf\xe9\n")
    err = _one_line(_refused(capsys, ["run", "--config", str(path), "--out", str(tmp_path / "out")]))
    assert f"config file {path} is not UTF-8 text (byte 0xe9 on line 2); TOML files are UTF-8" in err
    err = _one_line(_refused(capsys, ["run", "--config", str(tmp_path), "--out", str(tmp_path / "out")]))
    assert f"config file {tmp_path} is a folder, not a TOML file" in err


@pytest.mark.parametrize("argv, named", [
    (["ladder", "--preset", "tiny", "--framework", "torch", "--processes", "2", "--to-accuracy", "0.5", "--data",
      "{tmp}/unread.tar.gz", "--results", "{tmp}/out"], "--to-accuracy over 2 torch processes"),
    (["run", "--framework", "torch", "--sync-bn", "--source", "synthetic", "--out", "{tmp}/out"],
     "--sync-bn: torch's SyncBatchNorm runs on CUDA GPUs only"),
    (["run", "--init-weights", "{tmp}/missing.npz", "--source", "synthetic", "--out", "{tmp}/out"],
     "--init-weights {tmp}/missing.npz: no such file"),
    (["run", "--init-weights", "{tmp}/notes.txt", "--source", "synthetic", "--out", "{tmp}/out"],
     "--init-weights {tmp}/notes.txt is not a weights file"),
    (["run", "--checkpoint-dir", "{tmp}/notes.txt", "--checkpoint-every", "1", "--source", "synthetic", "--out",
      "{tmp}/out"], "--checkpoint-dir {tmp}/notes.txt is a file, not a folder"),
    (["run", "--xla-flags", "junk --xla_cpu_use_onednn=true", "--source", "synthetic", "--out", "{tmp}/out"],
     "xla_flags: 'junk' is not an XLA flag"),
    (["run", "--xla-flags=--xla_cpu_use_onednn=true -O3", "--source", "synthetic", "--out", "{tmp}/out"],
     "xla_flags: '-O3' is not an XLA flag"),
])
def test_impossible_combinations_are_refused_before_the_first_run(argv, named, tmp_path, monkeypatch, capsys,
                                                                   no_runs):
    """Item 12: each was refused per run after it started (exit 1, sometimes after minutes, a raw exception); item
    17: a refused command leaves no results folder."""
    from experiments.commands import ladder
    from experiments.execution import device

    monkeypatch.setattr(device, "cuda_available", lambda: False)  # no torch import (and this machine has no CUDA)
    monkeypatch.setattr(ladder, "cuda_available", lambda: False)
    (tmp_path / "notes.txt").write_text("not weights")
    err = _one_line(_refused(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv]))
    assert named.replace("{tmp}", str(tmp_path)) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../x", "/abs", "", "a/b", ".."])
def test_name_must_be_one_folder_name(name, tmp_path, capsys):
    """Item 13: ../x and /abs wrote outside --results; "" became the default name."""
    err = _one_line(_refused(capsys, ["ladder", "--name", name, "--results", str(tmp_path / "r")]))
    assert "argument --name: must be one folder name inside --results" in err and repr(name) in err
    assert not (tmp_path / "r").exists()


def test_damaged_archives_unknown_flags_and_long_texts_are_named(tmp_path, capsys):
    """Item 15: a damaged gzip read as "meta is missing"; an unknown flag pointed to the top-level help; a text
    over csv's 128 KiB field limit was refused instead of cut at max_len."""
    from common.data.cifar import read_cifar
    from common.data.text import load_text_source
    from common.errors import DataError
    from experiments.catalog.fixtures import write_cifar_archive

    archive = write_cifar_archive(tmp_path / "c", kind="cifar10", n_train=50, n_test=10, seed=0)
    data = bytearray(archive.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 200):
        data[i] ^= 0xFF
    damaged = tmp_path / "damaged.tar.gz"
    damaged.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"corrupt or truncated CIFAR archive .*damaged\.tar\.gz: BadGzipFile: CRC"):
        read_cifar(damaged, "cifar10", "test")
    empty = tmp_path / "empty.tar.gz"
    empty.write_bytes(b"")
    for source in ("cifar100", "mnist5k"):  # tarfile's reason spans five lines; numpy warned on two more
        err = _one_line(_refused(capsys, ["run", "--source", source, "--data", str(empty), "--out",
                                          str(tmp_path / "out")]))
        assert str(empty) in err and "corrupt" in err
    err = _one_line(_refused(capsys, ["ladder", "--no-such-flag"]))
    assert err == "twinrun ladder: error: unrecognized arguments: --no-such-flag (see 'twinrun ladder --help')"
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "train.csv").write_text(f'"1","long","{"x" * 200_000}"\n"2","short","y"\n')
    (folder / "test.csv").write_text('"1","a","b"\n')
    source = load_text_source(folder, "train", max_len=64)
    assert len(source) == 2 and int(source.lengths.max()) == 64


def test_cosmetics_of_help_messages_and_readme(tmp_path, capsys):
    """Item 17: help texts, --version, plural, the ladder's refusal names its own flags, README's infer row."""
    top = " ".join(build_parser().format_help().split())
    assert "the same ResNet" not in top and "ResNets, ViTs, text encoders" in top
    report_help = " ".join(_subparsers()["report"].format_help().split())
    assert "runs.jsonl" not in report_help and "runs.sqlite" in report_help
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("twinrun ")
    from experiments.options import plural

    assert (plural(1, "epoch"), plural(3, "epoch")) == ("1 epoch", "3 epochs")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    infer_row = next(line for line in readme.splitlines() if line.startswith("| `twinrun infer"))
    assert "INT4" in infer_row
