"""The driver beyond one device: the scaling sweep's throughput and efficiency table, the pipeline sweep's
plan, and the ladder over 2 replicas, as a plan (JAX's op-by-op rungs recorded as skipped, with the reason)."""

from __future__ import annotations

import json

import pytest

from common.config import RunConfig
from experiments.__main__ import main
from experiments.catalog.sweeps import SWEEPS
from experiments.execution.plan import sweep_plan


def _rows(folder, command: str) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("command") == command]


@pytest.mark.e2e
@pytest.mark.multiprocess
@pytest.mark.slow
def test_scaling_sweep_reports_throughput_and_efficiency_per_replica_count(cifar100_archive, tmp_path):
    code = main(["sweep", "scaling", "--preset", "tiny", "--values", "1", "2", "--repeats", "1", "--data",
                 str(cifar100_archive),
                 "--results", str(tmp_path), "--name", "scaling"])
    assert code == 0
    rows = _rows(tmp_path / "scaling", "sweep")
    controls = [r for r in rows if r.get("control") == "aa"]  # the A/A control: the reference value once more
    assert sorted((r["value"], r["framework"]) for r in controls) == [("1", "jax"), ("1", "torch")]
    rows = [r for r in rows if r not in controls]
    assert sorted((r["value"], r["framework"], r["status"], r["replicas"]) for r in rows) == [
        ("1", "jax", "ok", 1), ("1", "torch", "ok", 1), ("2", "jax", "ok", 2), ("2", "torch", "ok", 2)]
    rate = {(r["value"], r["framework"]): r["timing"]["images_per_s"] for r in rows}  # global images per second
    report = (tmp_path / "scaling" / "report.md").read_text()
    table = report[report.index("| replicas | framework | images/s"):].split("\n\n")[0].splitlines()[2:]
    cells = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line.strip("|").split("|") for line in table}
    for framework in ("torch", "jax"):  # efficiency = images/s at 2 / (2 x images/s at 1)
        expected = 100 * rate["2", framework] / (2 * rate["1", framework])
        assert float(cells["2", framework][4]) == round(expected)
        assert float(cells["1", framework][4]) == 100


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
