"""The driver beyond one device: the scaling sweep's throughput and efficiency table, the pipeline sweep's
plan, and the ladder over 2 replicas, as a plan (JAX's op-by-op rungs recorded as skipped, with the reason)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.config import RunConfig
from common.results import RunResult, Summary, Timing
from experiments.__main__ import main
from experiments.catalog.sweeps import SWEEPS
from experiments.execution.plan import sweep_plan
from experiments.execution.record import RunRecord
from experiments.reporting.analysis import analyse
from experiments.reporting.cells import sweep_cells
from experiments.reporting.tables import scaling_table


def _rows(folder, command: str) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("command") == command]


@pytest.mark.e2e
@pytest.mark.multiprocess
@pytest.mark.slow
def test_scaling_sweep_runs_two_replicas_and_reports_their_efficiency(cifar100_archive, tmp_path):
    """The path, once: the sweep starts torch's value 2 as 2 DDP processes and reports it. (JAX's replicas through
    the same driver path: tests/test_parallel.py runs JAX on 2 processes and on 4 host devices; the table's
    arithmetic, both frameworks: the canned-row test below.)"""
    code = main(["sweep", "scaling", "--preset", "tiny", "--values", "1", "2", "--repeats", "1", "--data",
                 str(cifar100_archive), "--framework", "torch", "--results", str(tmp_path), "--name", "scaling"])
    assert code == 0
    rows = _rows(tmp_path / "scaling", "sweep")
    controls = [r for r in rows if r.get("control") == "aa"]  # the A/A control: the reference value once more
    assert [(r["value"], r["framework"]) for r in controls] == [("1", "torch")]
    rows = [r for r in rows if r not in controls]
    assert sorted((r["value"], r["status"], r["replicas"], r["processes"]) for r in rows) == [
        ("1", "ok", 1, 1), ("2", "ok", 2, 2)]
    rate = {r["value"]: r["timing"]["images_per_s"] for r in rows}  # global images per second
    report = (tmp_path / "scaling" / "report.md").read_text()
    cells = _scaling_cells(report)
    assert float(cells["2", "torch"][4].split("[")[0]) == round(100 * rate["2"] / (2 * rate["1"]))


def _scaling_cells(report: str) -> dict[tuple[str, str], list[str]]:
    """The scaling table's cells by (replicas, framework)."""
    table = report[report.index("| replicas | framework | images/s"):].split("\n\n")[0].splitlines()[2:]
    return {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line.strip("|").split("|") for line in table}


def _scaling_record(value: str, framework: str, repeat: int, step_s: float) -> RunRecord:
    samples = [step_s * (1 + 0.002 * k) for k in range(8)]
    median = float(np.median(samples))
    timing = Timing(timed_steps=8, step_s=Summary(median, min(samples), max(samples), max(samples), min(samples),
                                                  max(samples), 8),
                    samples_s=samples, images_per_s=16 * int(value) / median)  # a 16-image batch per replica
    return RunRecord(key=f"sweep/scaling/{value}/{framework}/r{repeat}", command="sweep",
                     result=RunResult(framework=framework, status="ok", steps_done=10, timing=timing),
                     fields={"technique": "scaling", "knob": "devices", "value": value, "value_index": int(value),
                             "repeat": repeat})


def test_the_scaling_table_gives_throughput_and_efficiency_per_replica_count_with_intervals():
    """Canned rows (no run): 2 replicas take 1.25x (torch) and 1.5x (JAX) the step time of 1, each on a global batch
    twice as large: 1.6x and 1.33x the throughput, 80% and 67% efficiency, the intervals around them."""
    steps = {("1", "torch"): 0.100, ("2", "torch"): 0.125, ("1", "jax"): 0.200, ("2", "jax"): 0.300}
    records = [_scaling_record(value, framework, repeat, step * (1 + 0.01 * repeat))
               for (value, framework), step in steps.items() for repeat in range(3)]
    cells = sweep_cells(records)
    table = _scaling_cells(scaling_table(cells, analyse(cells, [])))
    for framework, throughput, efficiency in (("torch", 1.6, 80), ("jax", 1.33, 67)):
        assert float(table["1", framework][4].split("[")[0]) == 100
        assert table["2", framework][3].strip().startswith(f"{throughput:.2f}x [")
        point, bounds = table["2", framework][4].split("[")
        low, high = map(float, bounds.rstrip("] ").split(","))
        assert float(point) == efficiency and low < efficiency < high
        images = 16 * 2 / steps["2", framework]  # the table's images/s is the global batch's
        assert abs(float(table["2", framework][2]) - images) <= 0.02 * images


def test_pipeline_sweep_plans_one_and_two_stages_at_the_same_batch():
    base = RunConfig(batch_size=64, steps=4, epochs=None)
    plan = sweep_plan(SWEEPS["pipeline"], ["1", "2"], base, ("torch", "jax"), repeats=1, preset="cpu")
    plan = [p for p in plan if "control" not in p.fields]  # the A/A control repeats the reference, 1 stage
    assert sorted((p.fields["value"], p.framework, p.config.pipeline_stages, p.config.batch_size) for p in plan) == [
        ("1", "jax", 1, 64), ("1", "torch", 1, 64), ("2", "jax", 2, 64), ("2", "torch", 2, 64)]


def test_a_ladder_over_two_replicas_plans_the_jax_eager_rungs_as_skipped_and_reports_why(tmp_path):
    """A plan, tested as a plan (JAX over 2 devices: its compile rung is the scaling sweep's value 2, run above); the
    skipped rows are stored without a run and the report says why."""
    from experiments.catalog.rungs import Device
    from experiments.execution.plan import LadderOptions, Prepared, execute, ladder_plan
    from experiments.execution.store import ResultStore
    from experiments.options import console_for_output
    from experiments.reporting.report import write_report

    store = ResultStore(tmp_path)
    prepared = Prepared(RunConfig(steps=3, epochs=None, devices=2, workers=0), tmp_path, store, ("jax",))
    plan = ladder_plan(prepared, 1, "tiny", LadderOptions(Device(cuda=False, workers=0), ablations=False))
    jobs = {job.fields["rung"]: job for job in plan if "control" not in job.fields}
    assert set(jobs) == {"baseline", "loader", "flags", "amp", "compile"}
    for rung in ("baseline", "loader", "flags", "amp"):
        assert "eager on 2 devices" in jobs[rung].skip_reason
    assert jobs["compile"].skip_reason is None and jobs["compile"].config.devices == 2
    execute([job for job in plan if job.skip_reason], store, "ladder", 120.0, console_for_output())
    assert {row["status"] for row in store.rows() if row.get("command") == "ladder"} == {"skipped"}
    assert "skipped: JAX data parallel is jitted" in write_report(tmp_path).path.read_text()
