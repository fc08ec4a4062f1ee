"""Plans, tested as plans (nothing run), and the driver's own defects, each pinned: the class count comes from the
data (not 100) in the report's MFU FLOPs (``twinrun overhead``'s: tests/test_vit_driver.py);
the ladder's baseline reads with the 2 loader workers it describes; the report only reads the device's matmul rate,
which the plan measured and stored once per results folder."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from common.config import RunConfig
from common.results import RunResult, Summary, Timing
from common.workloads import arch
from experiments.catalog.rows import MATMUL_RATE_KEY
from experiments.catalog.rungs import BASELINE_TEXT, BASELINE_WORKERS, Device, ladder_rungs, rung_config
from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.paired import result_of
from experiments.execution.plan import LadderOptions, Prepared, execute, ladder_plan
from experiments.execution.record import RunRecord
from experiments.execution.store import ResultStore
from experiments.options import console_for_output
from experiments.reporting.flops import train_step_flops
from experiments.reporting.report import write_report
from experiments.reporting.tables import flops_per_step


def _cifar10_record(archive: Path, num_classes: int = 10, **changes) -> RunRecord:
    config = RunConfig(source="cifar10", data=str(archive), width=0.125, batch_size=16, steps=3, epochs=None, **changes)
    step = Summary(median=0.1, p10=0.1, p90=0.1, p99=0.1, min=0.1, max=0.1, n=2)
    result = RunResult(framework="torch", status="ok", steps_done=3, losses=[2.3, 2.2, 2.1], num_classes=num_classes,
                       timing=Timing(timed_steps=2, first_step_s=1.0, warmup_steps=1, step_s=step, compute_s=step,
                                     data_wait_fraction=0.0, images_per_s=160.0))
    return RunRecord(key="ladder/baseline/torch/r0", command="ladder", result=result, config=config.to_dict(),
                     fields={"rung": "baseline", "rung_index": 0, "repeat": 0, "preset": "tiny"})


def test_the_reports_flops_count_the_classes_of_the_data(cifar10_archive):
    record = _cifar10_record(cifar10_archive)
    config = RunConfig.from_dict(record.config)
    ten, hundred = (train_step_flops(arch(config, n), config.image_size, config.batch_size) for n in (10, 100))
    assert flops_per_step(record) == ten != hundred
    # A row written before results held their class count: the count of its data, read from the archive.
    old = {k: v for k, v in record.to_row().items() if k not in ("num_classes", "schema")}
    assert flops_per_step(RunRecord.from_row(old)) == ten
    # Only data that can no longer be read falls back to 100 classes.
    gone = {**old, "config": {**old["config"], "data": str(cifar10_archive.parent / "moved.tar.gz")}}
    assert flops_per_step(RunRecord.from_row(gone)) == hundred


def _mfu_cell(table: str) -> str:
    header, _, row = table.splitlines()[:3]
    columns = [c.strip() for c in header.strip("|").split("|")]
    return [c.strip() for c in row.strip("|").split("|")][columns.index("MFU %")]


def test_the_report_reads_the_matmul_rate_and_never_measures_it(cifar10_archive, tmp_path):
    store = ResultStore(tmp_path)
    record = _cifar10_record(cifar10_archive)
    store.add(record.to_row())
    before = (tmp_path / "runs.jsonl").read_text()
    report = write_report(tmp_path)
    assert (tmp_path / "runs.jsonl").read_text() == before  # nothing run, nothing stored
    assert "not measured" in report.path.read_text()
    assert _mfu_cell(report.table) == "-"

    rate = 1e10
    store.add({"key": MATMUL_RATE_KEY, "command": "device", "status": "ok", "flops_per_s": rate})
    mfu = float(_mfu_cell(write_report(tmp_path).table))
    assert mfu == pytest.approx(100 * flops_per_step(record) / 0.1 / rate, abs=0.05)


def test_the_plan_measures_the_matmul_rate_once_per_results_folder(tmp_path):
    store = ResultStore(tmp_path)
    execute([], store, "nothing planned", 120.0, console_for_output())
    (row,) = store.rows()
    assert row["key"] == MATMUL_RATE_KEY and row["status"] == "ok" and row["flops_per_s"] > 0
    execute([], store, "nothing planned", 120.0, console_for_output())
    assert store.rows() == [row]  # present: not measured again


def test_the_baseline_rung_reads_with_two_loader_workers(tmp_path):
    baseline, loader = ladder_rungs()[:2]
    assert BASELINE_WORKERS == 2
    adds, torch_text, jax_text = BASELINE_TEXT
    assert "2 loader workers" in adds and "2 workers" in torch_text and "2 workers" in jax_text
    base = RunConfig(steps=3, epochs=None)  # workers=0 by default: the baseline sets its own
    assert rung_config(baseline, base, Device(cuda=False, workers=8)).workers == 2
    assert rung_config(loader, base, Device(cuda=False, workers=8)).workers == 8  # the tuned count
    prepared = Prepared(base, tmp_path, ResultStore(tmp_path), FRAMEWORKS)
    plan = ladder_plan(prepared, 1, "tiny", LadderOptions(Device(cuda=False, workers=8)))
    assert {job.framework: job.config.workers for job in plan if job.fields["rung"] == "baseline"} == {
        "torch": 2, "jax": 2}


def test_a_job_that_died_is_a_failed_result_of_its_framework():
    result = result_of("jax", {"status": "failed", "error": "exit code 9: killed"})
    assert isinstance(result, RunResult) and (result.framework, result.status) == ("jax", "failed")
    assert result.error == "exit code 9: killed" and result.eval is None and math.isnan(result.final_loss)


def _ladder(tmp_path: Path, repeats: int, ablation_repeats: int | None = None):
    prepared = Prepared(RunConfig(steps=3, epochs=None, width=0.125, batch_size=16), tmp_path, ResultStore(tmp_path),
                        FRAMEWORKS)
    return prepared, ladder_plan(prepared, repeats, "tiny",
                                 LadderOptions(Device(False, 2), ablation_repeats=ablation_repeats))


def test_ablations_measured_in_the_first_repeats_only_when_asked(tmp_path):
    _, plan = _ladder(tmp_path, 3, ablation_repeats=1)
    ablations = {(job.fields["rung"], job.fields["repeat"]) for job in plan if job.fields["ablation"]}
    assert ablations and {repeat for _, repeat in ablations} == {0}
    cumulative = {job.fields["repeat"] for job in plan if not job.fields["ablation"]}
    assert cumulative == {0, 1, 2}  # the rungs and the A/A control keep every repeat
    assert len(_ladder(tmp_path / "all", 3)[1]) - len(plan) == len(ablations) * len(FRAMEWORKS) * 2  # r1, r2


class _Clock:
    """A job's planted wall time passes on this clock, not the machine's."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_time_budget_bounds_the_requested_repeats_too(tmp_path, monkeypatch):
    """--time-budget is the most the whole command takes: on a slow machine (every run 10 s here, a 300 s budget) the
    first repeat runs whole, the later repeat's runs stop where the budget would be overrun, the outcome says so
    (not a failure) and the report lists them; a rerun with a fresh budget adds exactly those."""
    from experiments.execution import plan as planning

    clock = _Clock()

    def run_job(job, timeout_s, store=None, previous=None):
        clock.now += 10.0
        step = Summary(0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 3)
        result = RunResult(job.framework, "ok", steps_done=3, losses=[4.6, 4.5, 4.4],
                           timing=Timing(timed_steps=3, first_step_s=1.0, warmup_steps=1, step_s=step))
        return RunRecord(key=job.key, command=job.command, result=result, config=job.config.to_dict(), wall_s=10.0,
                         fields=dict(job.fields))

    monkeypatch.setattr(planning, "run_job", run_job)
    monkeypatch.setattr(planning.time, "monotonic", clock)
    monkeypatch.setattr(planning, "ensure_matmul_rate", lambda store, timeout_s: None)
    prepared, plan = _ladder(tmp_path, 2)
    first = [job for job in plan if job.fields["repeat"] == 0]
    budget = planning.Adaptive(lambda records: set(), lambda number, only: [], budget_s=10.0 * len(first) + 45.0,
                               started=clock.now, first_repeat=2)
    outcome = execute(plan, prepared.store, "ladder", None, console_for_output(), adaptive=budget)
    assert outcome.complete and len(outcome.deferred) == len(plan) - len(first) - 4  # 4 more fit in 45 s
    assert all(key.endswith("/r1") for key in outcome.deferred)
    stored = {row["key"] for row in prepared.store.rows()}
    assert {job.key for job in first} <= stored and not set(outcome.deferred) & stored
    assert "time budget left" in planning.outcome_line(outcome)
    assert "left 14 requested run(s) of the later repeats out" in write_report(tmp_path).path.read_text()
    again = planning.Adaptive(lambda records: set(), lambda number, only: [], budget_s=1e4, started=clock.now)
    rerun = execute(plan, prepared.store, "ladder", None, console_for_output(), adaptive=again)
    assert rerun.complete and not rerun.deferred
    assert {job.key for job in plan} <= {row["key"] for row in prepared.store.rows()}


def test_the_compile_rung_and_the_scope_sweep_compile_the_same_computation_in_both_frameworks(tmp_path):
    """Issue 27: "compiled" means one scope in both frameworks, and each row's config says which. The ladder's
    compile rung compiles the whole update on both sides; the compile-scope sweep measures both scopes."""
    from experiments.catalog.sweeps import SWEEPS
    from experiments.execution.plan import sweep_plan

    _, plan = _ladder(tmp_path, 1)
    compiled = [job for job in plan if job.config.compile == "compiled"]
    assert compiled and {(job.config.compile_scope, job.framework) for job in compiled} == {("step", "torch"),
                                                                                              ("step", "jax")}
    assert all(job.config.to_dict()["compile_scope"] == "step" for job in compiled)  # in every row's config
    sweep = sweep_plan(SWEEPS["compile-scope"], ["eager", "model", "step"], RunConfig(), FRAMEWORKS, repeats=1,
                       preset="cpu")
    assert sorted((job.fields["value"], job.framework, job.config.compile, job.config.compile_scope)
                  for job in sweep if "control" not in job.fields) == [
        ("eager", "jax", "eager", "step"), ("eager", "torch", "eager", "step"),
        ("model", "jax", "compiled", "model"), ("model", "torch", "compiled", "model"),
        ("step", "jax", "compiled", "step"), ("step", "torch", "compiled", "step")]



@pytest.mark.parametrize("model,source", [("resnet18", "cifar100"), ("vit-micro", "cifar100"), ("text-micro", "text")])
def test_every_sweep_plans_the_same_fields_for_both_frameworks(model, source, request):
    """Issue 27's row-field test, on plans: each sweep value's torch and JAX jobs carry the same plan fields and the
    same config fields, the scope of compilation among them (a row is these plus RunResult's own fields, one dataclass
    for both frameworks: the gpu_check test compares real rows of the ladder, tests/test_inference.py of infer)."""
    from common.errors import ConfigError
    from experiments.catalog.presets import preset_settings
    from experiments.catalog.sweeps import SWEEPS, checked_values
    from experiments.execution.plan import sweep_plan

    data = str(request.getfixturevalue("text_folder")) if source == "text" else None  # its lengths shape the plan
    base = RunConfig(**{**preset_settings("tiny", model), "source": source, "data": data})
    compared = set()
    for sweep in SWEEPS.values():
        try:
            values = checked_values(sweep, sweep.default_values(base, False), base, FRAMEWORKS)
        except ConfigError:  # a sweep that refuses this model (attention of a ResNet, shapes of an image model)
            continue
        jobs: dict[tuple, dict] = {}
        for job in sweep_plan(sweep, values, base, FRAMEWORKS, repeats=1, preset="tiny"):
            key = (job.fields["value"], job.fields.get("control"), job.fields["repeat"])
            jobs.setdefault(key, {})[job.framework] = job
        for key, pair in jobs.items():
            if len(pair) < 2:  # a value with no meaning in one framework (compile-mode in JAX) is left out there
                continue
            assert set(pair["torch"].fields) == set(pair["jax"].fields), (sweep.name, key)
            assert set(pair["torch"].config.to_dict()) == set(pair["jax"].config.to_dict()), (sweep.name, key)
            assert "compile_scope" in pair["torch"].config.to_dict()
            compared.add(sweep.name)
    assert len(compared) >= 8, compared


def test_the_torchcompile_backend_flag_reaches_every_planned_run(cifar100_archive, tmp_path):
    """``--torchcompile-backend`` of a ladder or sweep (gpu_check.sh's TORCHCOMPILE_BACKEND) is in the base config of
    every run it plans; inductor by default; a name torch.compile does not know is refused by argparse."""
    import argparse

    from experiments.execution.plan import prepare
    from experiments.options import add_plan_arguments, plan_options

    parser = argparse.ArgumentParser()
    add_plan_arguments(parser, "ladder")
    common = ["--preset", "tiny", "--data", str(cifar100_archive), "--results", str(tmp_path)]
    assert prepare(plan_options(parser.parse_args(common)), "x").base.torchcompile_backend == "inductor"
    prepared = prepare(plan_options(parser.parse_args([*common, "--torchcompile-backend", "aot_eager"])), "x")
    plan = ladder_plan(prepared, 1, "tiny", LadderOptions(Device(False, 2), ablations=False))
    assert plan and {job.config.torchcompile_backend for job in plan} == {"aot_eager"}
    assert any(job.config.compile == "compiled" and job.framework == "torch" for job in plan)
    with pytest.raises(SystemExit):
        parser.parse_args([*common, "--torchcompile-backend", "tvm"])


def test_no_control_leaves_the_a_a_duplicate_out_of_ladders_and_sweeps_and_the_report_says_so(
        cifar100_archive, tmp_path):
    """``--no-control`` (gpu_check.sh's tiny preset: a smoke test of the plan, whose A/A runs other tests pay for)
    plans every rung or value and no A/A duplicate, in every repeat; without the flag each repeat has one per
    framework. The report then says its verdicts have no measured noise floor."""
    import argparse

    from experiments.catalog.sweeps import SWEEPS
    from experiments.execution.plan import prepare, sweep_plan
    from experiments.options import add_plan_arguments, plan_options
    from experiments.reporting.analysis import Analysis
    from experiments.reporting.report import _noise_text

    parser = argparse.ArgumentParser()
    add_plan_arguments(parser, "ladder")
    common = ["--preset", "tiny", "--data", str(cifar100_archive), "--results", str(tmp_path)]
    ladder = LadderOptions(Device(False, 2), ablations=False)
    for flags, controls in (([], 2 * len(FRAMEWORKS)), (["--no-control"], 0)):
        prepared = prepare(plan_options(parser.parse_args([*common, *flags])), "x")
        plan = ladder_plan(prepared, 2, "tiny", ladder)
        assert sum(job.fields.get("control") == "aa" for job in plan) == controls, flags
        measured = [job for job in plan if "control" not in job.fields]
        assert len(measured) == 2 * len(ladder_rungs(ablations=False)) * len(FRAMEWORKS)
        sweep = sweep_plan(SWEEPS["checkpointing"], ["none", "all"], prepared.base, FRAMEWORKS, repeats=2,
                           preset="tiny", control=prepared.control)
        assert sum(job.fields.get("control") == "aa" for job in sweep) == controls, flags
        assert len(sweep) - controls == 2 * 2 * len(FRAMEWORKS)
    assert "No A/A control in these rows (the job ran with --no-control" in _noise_text(Analysis(estimates={}))
