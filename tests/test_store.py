"""The results store holds under crashes and concurrency (SQLite, one transaction a row), never lets an unreadable
record block a read, never lets a failed attempt replace a measurement, and a resumed plan must match the
settings of the rows it resumes from. Issue 13, items 1-6 and 10."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import RunConfig
from common.errors import TwinrunError
from common.results import RunRecord, RunResult
from common.store import ResultStore, run_settings
from common.versions import host_info
from experiments.__main__ import main
from experiments.catalog.presets import PRESETS
from experiments.catalog.rungs import Device
from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.plan import LadderOptions, Prepared, ladder_plan
from experiments.reporting.report import write_report

REPO = Path(__file__).resolve().parents[1]


def _row(key: str, status: str = "ok", **extra: object) -> dict:
    return {"key": key, "command": "test", "status": status, **extra}


def _ladder_rows(archive: Path, out: Path, steps: int, status: str = "ok") -> list[dict]:
    """Rows as a tiny ladder of ``steps`` steps in ``out`` would have stored them (nothing is run)."""
    base = RunConfig(**{**PRESETS["tiny"], "steps": steps}, data=str(archive))
    plan = ladder_plan(Prepared(base, out, ResultStore(out), FRAMEWORKS), 1, "tiny", LadderOptions(Device(False, 2)))
    return [RunRecord(key=job.key, command="ladder", result=RunResult(job.framework, status, error="boom"),
                      config=job.config.to_dict(), host=host_info(), fields=dict(job.fields)).to_row() for job in plan]


def test_two_processes_writing_200_rows_each_to_one_store_end_with_400(tmp_path):
    code = ("import sys; from common.store import ResultStore\n"
            "store = ResultStore(sys.argv[1])\n"
            "for i in range(200):\n"
            "    store.add({'key': f'{sys.argv[2]}/{i}', 'status': 'ok', 'value': i})\n")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), name], cwd=REPO, stderr=subprocess.PIPE,
                                text=True) for name in "ab"]
    ended = [(w.wait(timeout=300), w.stderr.read()[-2000:]) for w in writers]
    assert [code for code, _ in ended] == [0, 0], ended
    store = ResultStore(tmp_path)
    keys = [r["key"] for r in store.rows()]
    assert len(keys) == len(set(keys)) == 400, (len(keys), len(set(keys)), [err for _, err in ended])
    exported = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert len(exported) == 400  # the last export, taken under the write lock, holds every row
    assert len((tmp_path / "runs.csv").read_text().splitlines()) == 401


def test_a_torn_line_of_an_old_runs_jsonl_is_reported_skipped_and_kept_aside(tmp_path, capsys):
    good = [_row("a"), _row("b")]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good) + '{"key": "lad')
    store = ResultStore(tmp_path)
    assert [r["key"] for r in store.rows()] == ["a", "b"]
    warning = capsys.readouterr().err
    assert "runs.jsonl, line 3" in warning and "skipped" in warning
    assert '{\\"key\\": \\"lad' in (tmp_path / "runs.rejected.jsonl").read_text()  # kept, not dropped
    store.add(_row("c"))
    assert [r["key"] for r in ResultStore(tmp_path).rows()] == ["a", "b", "c"]
    assert (tmp_path / "runs.jsonl").read_text().count("\n") == 3


def test_a_torn_line_appended_to_the_export_blocks_nothing_and_is_kept_aside(tmp_path, capsys):
    store = ResultStore(tmp_path)
    store.add(_row("a"))
    with (tmp_path / "runs.jsonl").open("a") as handle:
        handle.write('{"key": "lad')
    assert [r["key"] for r in store.rows()] == ["a"]  # the store is the database; the export is not read
    assert "runs.jsonl differs from the store's last export" in capsys.readouterr().err
    store.add(_row("b"))
    (edited,) = tmp_path.glob("runs.jsonl.edited-*")
    assert edited.read_text().endswith('{"key": "lad') and "changed outside twinrun" in capsys.readouterr().err
    assert [json.loads(line)["key"] for line in (tmp_path / "runs.jsonl").read_text().splitlines()] == ["a", "b"]


def test_a_failed_attempt_never_replaces_a_finished_row(tmp_path):
    store = ResultStore(tmp_path)
    store.add(_row("infer/torch/eager", "ok", p50=1.0))
    assert store.add(_row("infer/torch/eager", "failed", error="no timed samples")) is False
    assert store.rows() == [_row("infer/torch/eager", "ok", p50=1.0)]
    assert store.add(_row("infer/torch/eager", "ok", p50=2.0)) is True  # a new measurement does replace it
    store.add(_row("x", "failed"))
    assert store.add(_row("x", "ok")) and store.finished_keys() == {"infer/torch/eager", "x"}


def test_rows_of_other_settings_are_refused_with_what_changed(cifar100_archive, tmp_path):
    store = ResultStore(tmp_path)
    rows = _ladder_rows(cifar100_archive, tmp_path, steps=3)
    store.add_many(rows)
    key, config = rows[0]["key"], RunConfig.from_dict(rows[0]["config"])
    with pytest.raises(TwinrunError, match=r"config\.steps: 3 -> 7.*--fresh"):
        store.check_resumable({key: run_settings(config.replace(steps=7).to_dict(), host_info())})
    newer = {**host_info(), "versions": {**host_info()["versions"], "torch": "9.9"}}
    with pytest.raises(TwinrunError, match=r"host\.versions\.torch"):
        store.check_resumable({key: run_settings(config.to_dict(), newer)})
    # the same settings resume; the test hooks and the weights' path are not settings
    same = config.replace(init_weights="elsewhere.npz", fail_after_step=1)
    store.check_resumable({key: run_settings(same.to_dict(), host_info())})


def test_a_ladder_with_changed_steps_is_not_answered_from_old_rows(cifar100_archive, tmp_path, capsys):
    folder = tmp_path / "t"
    ResultStore(folder).add_many(_ladder_rows(cifar100_archive, folder, steps=3))
    before = ResultStore(folder).rows()
    code = main(["ladder", "--preset", "tiny", "--steps", "7", "--repeats", "1", "--data", str(cifar100_archive),
                 "--results", str(tmp_path), "--name", "t"])
    err = capsys.readouterr().err
    assert code == 2 and "config.steps: 3 -> 7" in err and "--fresh" in err and "Traceback" not in err
    assert ResultStore(folder).rows() == before


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusals
        return int(exc.code)


def test_fresh_with_a_bad_argument_leaves_the_old_results_in_place(cifar100_archive, tmp_path, capsys):
    folder = tmp_path / "t"
    ResultStore(folder).add_many(_ladder_rows(cifar100_archive, folder, steps=3))
    before = ResultStore(folder).rows()
    plan = ["ladder", "--preset", "tiny", "--repeats", "1", "--results", str(tmp_path), "--name", "t", "--fresh"]
    for bad, named in ((["--data", str(tmp_path / "nope.tar.gz")], "nope.tar.gz"), (["--steps", "0"], "steps")):
        assert _exit_code([*plan, *bad]) == 2
        assert named in capsys.readouterr().err
        assert ResultStore(folder).rows() == before and not (folder / "old").exists()


def test_fresh_moves_the_old_results_aside_and_deletes_nothing(tmp_path):
    store = ResultStore(tmp_path)
    store.add(_row("a"))
    (tmp_path / "report.md").write_text("old report")
    moved = store.move_aside()
    assert moved is not None and moved.parent == tmp_path / "old"
    assert {p.name for p in moved.iterdir()} >= {"runs.sqlite", "runs.jsonl", "runs.csv", "report.md"}
    assert store.rows() == [] and ResultStore(moved).rows() == [_row("a")]


def test_the_report_of_a_folder_where_every_run_failed_is_written(cifar100_archive, tmp_path):
    ResultStore(tmp_path).add_many(_ladder_rows(cifar100_archive, tmp_path, steps=3, status="failed"))
    report = write_report(tmp_path).path.read_text()
    assert "No plots: no run in this folder finished" in report and "boom" in report


def test_files_follow_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        store = ResultStore(tmp_path / "r")
        store.add(_row("a", "failed", framework="torch", error="boom"))
        write_report(tmp_path / "r")
    finally:
        os.umask(previous)
    for name in ("runs.sqlite", "runs.jsonl", "runs.csv", "report.md"):
        assert stat.S_IMODE((tmp_path / "r" / name).stat().st_mode) == 0o644, name
