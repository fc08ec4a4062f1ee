"""The ladder: every rung x framework runs in its own process; a failed run is recorded and the rest go
on; rerunning resumes (finished runs are skipped, nothing is duplicated); the report renders."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.__main__ import main


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]


def test_tiny_ladder_runs_every_rung_in_both_frameworks_and_reports(cifar100_archive, tmp_path):
    code = main(["ladder", "--preset", "tiny", "--repeats", "1", "--data", str(cifar100_archive),
                 "--results", str(tmp_path), "--name", "both"])
    assert code == 0
    folder = tmp_path / "both"
    runs = [r for r in _rows(folder) if r.get("command") == "ladder"]
    assert {(r["rung"], r["framework"]) for r in runs} == {
        (rung, fw) for rung in ("baseline", "loader", "flags", "amp", "compile") for fw in ("torch", "jax")}
    assert all(r["status"] == "ok" for r in runs)
    # every run of one framework started from the same transferred weights
    assert len({r["config"]["init_weights"] for r in runs}) == 1
    by_rung = {(r["rung"], r["framework"]): r for r in runs}
    assert by_rung[("amp", "jax")]["config"]["precision"] == "bf16"
    assert by_rung[("compile", "torch")]["config"]["compile"] == "compiled"
    report = (folder / "report.md").read_text()
    assert "| compile | jax |" in report and "published" in report and "What each rung means" in report
    for plot in ("ladder_step_time.png", "ladder_data_wait.png"):
        assert (folder / plot).read_bytes()[:4] == b"\x89PNG"


def test_a_failed_run_is_recorded_and_a_rerun_resumes_without_duplicates(cifar100_archive, tmp_path):
    args = ["ladder", "--preset", "tiny", "--repeats", "1", "--framework", "torch", "--data", str(cifar100_archive),
            "--results", str(tmp_path), "--name", "resume"]
    assert main(args + ["--inject-failure", "flags:torch"]) == 0
    folder = tmp_path / "resume"
    first = {r["key"]: r for r in _rows(folder) if r.get("command") == "ladder"}
    assert first["ladder/flags/torch/r0"]["status"] == "failed"
    assert "exit code 9" in first["ladder/flags/torch/r0"]["error"]
    assert all(r["status"] == "ok" for k, r in first.items() if k != "ladder/flags/torch/r0")
    assert "failed" in (folder / "report.md").read_text()

    assert main(args) == 0  # resume: only the failed run is run again
    second = [r for r in _rows(folder) if r.get("command") == "ladder"]
    assert len(second) == len({r["key"] for r in second}) == 5
    again = {r["key"]: r for r in second}
    assert again["ladder/flags/torch/r0"]["status"] == "ok"
    for key, row in first.items():
        if key != "ladder/flags/torch/r0":
            assert again[key]["wall_s"] == row["wall_s"]  # untouched: not run again
