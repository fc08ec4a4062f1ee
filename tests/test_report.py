"""Reports on canned rows: the accuracy verdict, time to target, the curves plot (no run: every case in
milliseconds)."""

from __future__ import annotations

import math

import pytest

from common.results import Evaluation, RunResult
from experiments.execution.record import RunRecord
from experiments.reporting.accuracy import time_to_target, verdict
from experiments.reporting.curves import plot_curves


def test_a_planted_accuracy_drop_is_lost_and_noise_is_not():
    baseline = [0.50, 0.52, 0.48]  # sample std 0.02: tolerance 0.04
    lost = verdict(baseline, [0.44, 0.45, 0.43])
    assert lost.label == "lost" and lost.lost and lost.delta == pytest.approx(-0.06)
    assert lost.tolerance == pytest.approx(0.04) and lost.n == 3 and lost.std == pytest.approx(0.01)
    within = verdict(baseline, [0.47, 0.46, 0.48])  # 0.03 lower: within 2 standard deviations
    assert within.label == "intact" and not within.lost
    assert verdict([0.5, 0.5, 0.5], [0.485] * 3).label == "lost"  # agreeing repeats: the 0.01 floor judges


def test_one_baseline_repeat_uses_the_floor_and_says_so():
    intact, lost = verdict([0.5], [0.495]), verdict([0.5], [0.48, 0.49])
    assert intact.label == "intact (no spread: 1 repeat)" and intact.tolerance == 0.01
    assert lost.label == "lost (no spread: 1 repeat)" and lost.lost and "tolerance 0.010" in lost.text
    nothing = verdict([0.5, 0.51], [math.nan])
    assert nothing.label == "no result" and nothing.n == 0 and nothing.text == "no result"
    assert verdict([], [0.5]).label == "no baseline"


def test_time_to_target_is_the_first_evaluation_reaching_it():
    evals = [Evaluation(4, 0.2, 2.0, 64, 10.0, 1.0), Evaluation(8, 0.6, 1.0, 64, 12.0, 2.0),
             Evaluation(12, 0.7, 0.9, 64, 14.0, 3.0)]
    result = RunResult(framework="torch", status="ok", evals=evals)
    assert time_to_target(result, 0.5) == (12.0, 2.0) and time_to_target(result, 0.9) is None


def _record(rung: str, index: int, framework: str, repeat: int = 0, status: str = "ok") -> RunRecord:
    losses = [2.3 - 0.1 * i - 0.05 * index for i in range(8)]
    evals = [Evaluation(4, 0.2 + 0.1 * index, 2.0, 64, 5.0 + index, 1.0), Evaluation(8, 0.4, 1.5, 64, 7.0, 2.0)]
    result = RunResult(framework=framework, status=status, steps_done=8, losses=losses if status == "ok" else [],
                       step_elapsed_s=[4.0 + 0.3 * i for i in range(8)] if status == "ok" else [],
                       evals=evals if status == "ok" else [])
    return RunRecord(key=f"ladder/{rung}/{framework}/r{repeat}", command="ladder", result=result,
                     fields={"rung": rung, "rung_index": index, "repeat": repeat})


def test_plot_curves_draws_the_finished_runs_and_nothing_without_losses(tmp_path):
    old = RunRecord.from_row({"key": "old", "command": "ladder", "framework": "jax", "status": "ok", "losses": [2.0],
                              "rung": "amp", "rung_index": 2, "repeat": 0})  # no wall times: still drawn by step
    records = [_record(r, i, f, repeat) for i, r in enumerate(("baseline", "loader")) for f in ("torch", "jax")
               for repeat in (0, 1)] + [_record("amp", 2, "torch", status="failed"), old]
    path = plot_curves(records, tmp_path / "curves.png")
    assert path == tmp_path / "curves.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    failed = [_record("baseline", 0, "torch", status="failed")]
    assert plot_curves(failed, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
