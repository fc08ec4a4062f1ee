"""Intervals and verdicts that noise cannot fake (issue 25), on runs drawn from known distributions (seeded): an A/A
pair is called "no detectable difference", a planted slowdown at this machine's noise is called "slower", the 95%
interval covers the true ratio about 95% of the time, and the two-level bootstrap that the t interval replaced
covers less with few runs. Then the words of the verdicts, the within-process intervals, the recommendation on
planted rows, and the A/A control and the seeded order in a plan."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from common.config import RunConfig
from common.results import RunResult, Summary, Timing
from experiments.catalog.rows import AA_SUFFIX
from experiments.catalog.rungs import Device
from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.host import host_info
from experiments.execution.plan import LadderOptions, Prepared, ladder_plan
from experiments.execution.record import RunRecord
from experiments.execution.store import ResultStore
from experiments.reporting import stats
from experiments.reporting.analysis import analyse, ladder_pairs, recommend
from experiments.reporting.cells import ladder_cells
from experiments.reporting.recommend import Answer
from experiments.reporting.report import write_report

# The noise measured on this project's machines (2-core shared hosts), as the spread of log step times: between runs
# (processes) of one configuration, and between the timed steps of one run. Measured with `twinrun ladder --preset
# cpu --repeats 4` (2026-12-05, Intel Xeon with AMX, 2 cores, nothing else of ours running; the closing note of
# issue 25): the run-to-run standard deviation of log median step times, pooled over the 9 configurations, was 0.126
# (torch) and 0.160 (JAX); the within-run one of log step times 0.041 and 0.060.
BETWEEN_RUNS = 0.15
WITHIN_RUN = 0.05
STEPS = 8  # timed steps a run (experiments/catalog/presets.py's cpu preset)
TRIALS = 200


def _run_medians(rng: np.random.Generator, log_mean: float, runs: int, between: float = BETWEEN_RUNS,
                 within: float = WITHIN_RUN, steps: int = STEPS) -> list[np.ndarray]:
    """``runs`` runs' step times: a run's own level (the machine's mood in that process) plus each step's noise,
    with 5% of the steps 3-10x slower (a page fault, another tenant's burst)."""
    out = []
    for _ in range(runs):
        logs = log_mean + rng.normal(0, between) + rng.normal(0, within, steps)
        slow = rng.random(steps) < 0.05
        logs[slow] += np.log(rng.uniform(3, 10, slow.sum()))
        out.append(np.exp(logs))
    return out


def _medians(runs: list[np.ndarray]) -> list[float]:
    return [float(np.median(r)) for r in runs]


def _job(rng: np.random.Generator, ratio: float, runs: int, between: float = BETWEEN_RUNS,
         within: float = WITHIN_RUN) -> stats.Comparison:
    """One simulated job: seven other configurations (they pool the spread, as a ladder's do), the A/A control
    (the noise floor) and the compared pair, B at ``ratio`` times A's step time."""
    levels = {f"other-{i}": math.log(0.1) + rng.normal(0, 0.5) for i in range(7)}
    levels |= {"A": math.log(0.1), "B": math.log(0.1 * ratio), "control": math.log(0.05)}
    groups = {name: _medians(_run_medians(rng, level, runs, between, within)) for name, level in levels.items()}
    groups["control" + AA_SUFFIX] = _medians(_run_medians(rng, levels["control"], runs, between, within))
    found = stats.estimates(groups, "torch")
    floor = stats.floor_of(found["control"], found["control" + AA_SUFFIX])
    return stats.compare(found["A"], found["B"], floor)


@pytest.mark.parametrize("runs", [4, 12])
def test_an_aa_pair_is_no_detectable_difference_and_the_interval_covers_the_truth(runs):
    rng = np.random.default_rng(25)
    judged = [_job(rng, 1.0, runs) for _ in range(TRIALS)]
    calm = sum(c.verdict == stats.NO_DIFFERENCE for c in judged)
    assert calm >= 0.95 * TRIALS, calm
    covered = sum(c.lo <= 1.0 <= c.hi for c in judged)
    assert 0.92 * TRIALS <= covered <= 0.98 * TRIALS, covered


def test_a_planted_slowdown_at_this_machines_noise_is_called_slower_with_its_true_size_covered():
    """At this machine's run-to-run spread (0.15 of a log step time), a 20% slowdown is called with 95% reliability
    only with ~36 runs a configuration: the verdict asks its whole interval to clear the A/A floor. (Simulated the
    same way: a 1.5x slowdown needs 6 runs, a 2x one 3.)"""
    rng = np.random.default_rng(26)
    judged = [_job(rng, 1.2, runs=36) for _ in range(TRIALS)]
    slower = [c for c in judged if c.verdict == stats.SLOWER]
    assert len(slower) >= 0.95 * TRIALS, len(slower)
    assert all(c.text().startswith("slower by ") for c in slower)
    covered = sum(c.lo <= 1.2 <= c.hi for c in judged)
    assert 0.92 * TRIALS <= covered <= 0.98 * TRIALS, covered
    assert not any(c.verdict == stats.FASTER for c in judged)


def _two_level_bootstrap(a: list[np.ndarray], b: list[np.ndarray], rng: np.random.Generator,
                         resamples: int = 400) -> tuple[float, float]:
    """The hierarchical bootstrap of the ratio of geometric means of run medians: runs resampled, then each drawn
    run's steps resampled (vectorised over the resamples)."""
    def draws(runs: list[np.ndarray]) -> np.ndarray:
        steps = np.stack(runs)  # runs x steps
        picked = steps[rng.integers(0, len(runs), (resamples, len(runs)))]  # resamples x runs x steps
        inner = rng.integers(0, steps.shape[1], picked.shape)
        medians = np.median(np.take_along_axis(picked, inner, axis=2), axis=2)
        return np.log(medians).mean(axis=1)

    lo, hi = np.percentile(draws(b) - draws(a), [2.5, 97.5])
    return math.exp(lo), math.exp(hi)


def test_the_two_level_bootstrap_undercovers_with_few_runs_where_the_t_interval_does_not():
    """Why reporting/stats.py uses t intervals: where the run-to-run spread dominates (a process lands on a busy
    or a quiet minute), resampling 2 runs covers the true ratio far less than 95%; the t interval on the same runs
    (pooled over the job's configurations) keeps its promise."""
    rng = np.random.default_rng(27)
    boot = t = 0
    for _ in range(TRIALS):
        levels = {f"c{i}": math.log(0.1) + rng.normal(0, 0.5) for i in range(7)} | {"A": math.log(0.1),
                                                                                   "B": math.log(0.1)}
        runs = {name: _run_medians(rng, level, 2, between=0.1, within=0.02) for name, level in levels.items()}
        lo, hi = _two_level_bootstrap(runs["A"], runs["B"], rng)
        boot += lo <= 1 <= hi
        found = stats.estimates({k: _medians(v) for k, v in runs.items()}, "torch")
        c = stats.compare(found["A"], found["B"])
        t += c.lo <= 1 <= c.hi
    assert boot < 0.85 * TRIALS, boot
    assert 0.92 * TRIALS <= t <= 0.98 * TRIALS, t


def test_the_verdicts_use_their_words_and_the_floor_and_few_runs_keep_them_undecided():
    assert stats.judge(0.8, 0.75, 0.85).text() == "faster by 20.0% [15.0, 25.0]"
    assert stats.judge(1.1, 1.05, 1.15).text() == "slower by 10.0% [5.0, 15.0]"
    inside = stats.judge(1.02, 0.97, 1.07)
    assert inside.verdict == stats.NO_DIFFERENCE and inside.text().startswith("no detectable difference [-3.0%")
    below = stats.judge(1.06, 1.02, 1.10, floor=math.log(1.04))  # real by its interval, reaching into the floor
    assert below.verdict == stats.NO_DIFFERENCE and "into the noise floor of 4.0%" in below.text()
    assert stats.judge(1.10, 1.05, 1.15, floor=math.log(1.04)).verdict == stats.SLOWER  # wholly beyond it
    one_run = stats.estimates({"a": [0.1], "b": [0.2]}, "torch")  # nothing to pool: no interval, no verdict
    c = stats.compare(one_run["a"], one_run["b"])
    assert c.verdict == stats.NO_DIFFERENCE and math.isnan(c.lo) and "too few runs" in c.text()
    assert c.ratio == pytest.approx(2.0)
    # one configuration with a spread 30x the others': Levene says so, and each keeps its own (Welch)
    rng = np.random.default_rng(3)
    groups = {f"c{i}": list(np.exp(rng.normal(0, 0.01, 4))) for i in range(4)} | {
        "noisy": list(np.exp(rng.normal(0, 0.3, 4)))}
    found = stats.estimates(groups, "torch")
    assert found["noisy"].spread.pool is None and found["noisy"].spread.df == 3
    assert found["noisy"].half_width() > 10 * found["c0"].half_width()


def test_within_one_process_the_median_and_its_ratio_have_intervals():
    rng = np.random.default_rng(4)
    calls = list(rng.lognormal(0, 0.1, 100))
    median, lo, hi = stats.median_interval(calls)
    assert lo < median < hi and median == pytest.approx(np.median(calls))
    p99, lo99, hi99 = stats.quantile_interval(calls, 0.99)
    assert lo99 <= p99 and math.isnan(hi99)  # 100 calls cannot bound a p99 from above
    slower = [c * 1.3 for c in calls]
    ratio, lo, hi = stats.bootstrap_ratio(calls, slower, paired=True)
    assert lo < 1.3 < hi and ratio == pytest.approx(1.3)
    assert stats.bootstrap_ratio(calls, slower, paired=True) == (ratio, lo, hi)  # seeded: the same report twice


# --- the ladder's plan and answer ---------------------------------------------------------------------------------


def _plan(tmp_path: Path, repeats: int, seed: int = 0):
    base = RunConfig(steps=3, epochs=None, width=0.125, batch_size=16)
    prepared = Prepared(base, tmp_path, ResultStore(tmp_path), FRAMEWORKS)
    return ladder_plan(prepared, repeats, "tiny", LadderOptions(Device(False, 2)), order_seed=seed)


def test_each_repeat_runs_in_a_seeded_random_order_with_the_aa_control_in_it(tmp_path):
    plan = _plan(tmp_path, repeats=2)
    assert plan == _plan(tmp_path, repeats=2)  # a rerun plans the same order: resume finds the same keys
    first = [job.key for job in plan if job.fields["repeat"] == 0]
    second = [job.key.replace("/r1", "/r0") for job in plan if job.fields["repeat"] == 1]
    assert sorted(first) == sorted(second) and first != second  # each repeat shuffled on its own
    assert [job.key for job in _plan(tmp_path, 2, seed=1)] != [job.key for job in plan]
    assert all(job.fields["order"] == i % len(first) and job.fields["order_seed"] == 0 for i, job in enumerate(plan))
    controls = [job for job in plan if job.fields.get("control") == "aa"]
    assert {(job.framework, job.fields["repeat"]) for job in controls} == {(f, r) for f in FRAMEWORKS for r in (0, 1)}
    top = {job.framework: job.config for job in plan if job.key.startswith("ladder/compile/")}
    assert all(job.config.replace(tensorboard_dir=None) == top[job.framework].replace(tensorboard_dir=None)
               for job in controls)  # the same configuration as the top rung
    # the first run of each compile cache in the job compiles cold, whatever its place; every later one reads it
    seen: set[str] = set()
    for job in plan:
        assert job.cold == (job.cache not in seen) and job.fields["cache"].startswith("cold" if job.cold else "warm")
        seen.add(job.cache)


def _record(job, seconds: float) -> RunRecord:
    step = Summary(seconds, seconds, seconds, seconds, seconds, seconds, 8)
    result = RunResult(job.framework, "ok", steps_done=3, losses=[4.6, 4.5, 4.4], device="cpu",
                       timing=Timing(timed_steps=8, first_step_s=2.0, warmup_steps=2, step_s=step))
    return RunRecord(key=job.key, command="ladder", result=result, config=job.config.to_dict(), host=host_info(),
                     fields=dict(job.fields))


def _planted(tmp_path: Path, ms: dict[str, float], repeats: int = 4, noise: float = 0.02) -> list[RunRecord]:
    rng = np.random.default_rng(5)
    plan = _plan(tmp_path, repeats)
    return [_record(job, ms[job.fields["rung"]] / 1e3 * math.exp(rng.normal(0, noise))) for job in plan]


def test_the_recommendation_is_the_simplest_configuration_tied_with_the_fastest(tmp_path):
    # loader halves the step; flags, amp and compile add nothing detectable; dropping the loader costs it back
    ms = {"baseline": 100, "loader": 50, "flags": 50, "amp": 49.5, "compile": 49, "minus-loader": 100,
          "minus-flags": 49.5, "minus-amp": 50}
    records = _planted(tmp_path, ms)
    cells = ladder_cells(records)
    analysis = analyse(cells, ladder_pairs(cells, ("loader", "flags", "amp", "compile")))
    for framework in FRAMEWORKS:
        rec = recommend(analysis, cells, framework)
        assert rec is not None and rec.chosen == "loader" and rec.fastest in ("compile", "amp", "minus-flags")
        assert "minus-loader" not in rec.tied and {"compile", "amp", "flags"} - {rec.fastest} <= set(rec.tied)
        assert rec.supported and rec.against_baseline.verdict == stats.FASTER
        line = Answer(rec, cells, analysis.estimates).line()
        assert line.startswith(f"{framework}: recommended: loader (loader)") and "tied with" in line
        assert "faster by 50." in line and f"twinrun run --framework {framework}" in line
    flags = analysis.find("vs the rung below", ("flags", "torch"))
    assert flags.comparison.verdict == stats.NO_DIFFERENCE  # a technique with no effect here is called so


def test_a_recommendation_the_data_cannot_support_says_so(tmp_path):
    ms = dict.fromkeys(("baseline", "loader", "flags", "amp", "compile", "minus-loader", "minus-flags", "minus-amp"),
                       100.0)
    records = _planted(tmp_path, ms, repeats=2, noise=0.05)
    cells = ladder_cells(records)
    analysis = analyse(cells, ladder_pairs(cells, ("loader", "flags", "amp", "compile")))
    rec = recommend(analysis, cells, "torch")
    assert not rec.supported
    assert "no recommendation the data can support" in Answer(rec, cells, analysis.estimates).line()


def test_the_report_gives_intervals_verdicts_the_noise_floor_and_the_undecided(tmp_path):
    ms = {"baseline": 100, "loader": 50, "flags": 50, "amp": 49.5, "compile": 49, "minus-loader": 100,
          "minus-flags": 49.5, "minus-amp": 50}
    store = ResultStore(tmp_path)
    for record in _planted(tmp_path, ms):
        store.add(record.to_row())
    report = write_report(tmp_path)
    text = report.path.read_text()
    assert "step ms [95% CI]" in text and "| compile | torch |" in text and "faster by " in text
    assert "## Noise floor (A/A control)" in text and "compile run twice per repeat (4 + 4 runs)" in text
    assert "## Undecided comparisons" in text and "flags vs the rung below (loader), torch" in text
    assert "## JAX against torch at each rung" in text
    assert "Accuracy: '-' in step-time mode" in text
    assert "- CPU: " in text and "{'python'" not in text  # the host as readable lines, not a dict
    assert report.tables and "| minus-loader | torch |" in report.tables[0]  # the console shows the ablations too
    assert (tmp_path / "ladder_step_time.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_matches_two_folders_with_verdicts_and_names_settings_that_differ(tmp_path, capsys):
    """`twinrun compare A B` (pyperf's compare_to for two results folders): B's compile rung planted 1.5x slower is
    "slower", the rest "no detectable difference"; a folder run with other settings is not matched silently."""
    from experiments.__main__ import main

    ms = {"baseline": 100, "loader": 50, "flags": 50, "amp": 49.5, "compile": 49, "minus-loader": 100,
          "minus-flags": 49.5, "minus-amp": 50}
    folders = {}
    for name, changes in (("a", {}), ("b", {"compile": 73.5}), ("c", {})):
        folder = tmp_path / name
        store = ResultStore(folder)
        for record in _planted(folder, {**ms, **changes}):
            if name == "c":  # another batch size: not the same configuration
                record = RunRecord.from_row({**record.to_row(), "config": {**record.config, "batch_size": 32}})
            store.add(record.to_row())
        folders[name] = str(folder)
    assert main(["compare", folders["a"], folders["b"], "--out", str(tmp_path / "ab.md")]) == 0
    text = (tmp_path / "ab.md").read_text()
    compile_lines = [line for line in text.splitlines() if line.startswith("| compile |")]
    assert len(compile_lines) == 2 and all("slower by " in line for line in compile_lines), compile_lines
    assert "| loader | torch |" in text and "no detectable difference" in text
    capsys.readouterr()
    assert main(["compare", folders["a"], folders["c"]]) == 0
    assert "batch_size" in capsys.readouterr().out  # named, not matched
