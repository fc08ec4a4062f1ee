"""Typed results: a row round-trips, and rows written before the types (schema 1) still read."""

from __future__ import annotations

import json
import math
from dataclasses import replace

from common.results import NAN, SCHEMA, Evaluation, Memory, RunResult, Summary, Timing
from experiments.execution.record import RunRecord
from experiments.execution.store import ResultStore
from experiments.reporting.tables import augmentation_text


def _result() -> RunResult:
    summary = Summary(median=0.1, p10=0.09, p90=0.12, p99=0.13, min=0.08, max=0.14, n=5)
    return RunResult(framework="jax", status="ok", steps_done=8, losses=[4.6, 4.5], loss_scales=[1.0, 1.0],
                     timing=Timing(timed_steps=5, first_step_s=3.0, warmup_steps=2, step_s=summary, compute_s=summary,
                                   data_wait_s=summary, data_wait_fraction=0.1, images_per_s=640.0),
                     memory=Memory(saved_for_backward_bytes=123), evals=[Evaluation(8, 0.25, 4.1, 200)],
                     final_lr=0.01, notes=["a note"], device="cpu", framework_version="0.10.2", num_classes=10)


def test_a_result_and_its_record_round_trip_through_a_json_row(tmp_path):
    record = RunRecord(key="ladder/amp/jax/r0", command="ladder", result=_result(), config={"model": "resnet18"},
                       host={"cpus": 2}, wall_s=12.5, fields={"rung": "amp", "repeat": 0})
    row = json.loads(json.dumps(record.to_row()))
    assert row["schema"] == SCHEMA and row["rung"] == "amp"
    again = RunRecord.from_row(row)
    assert again == record
    store = ResultStore(tmp_path)
    store.add(row)
    assert store.records() == [record]


def test_a_schema_1_row_still_reads():
    old = {"key": "ladder/baseline/torch/r0", "command": "ladder", "rung": "baseline", "framework": "torch",
           "status": "ok", "steps_done": 8, "losses": [4.7], "torch": "2.14.1", "replicas": 1,
           "timing": {"first_step_s": 1.0, "warmup_steps": 2, "timed_steps": 6,
                      "step_s": {"median": 0.09, "p10": 0.08, "p90": 0.1, "p99": 0.1, "min": 0.08, "max": 0.1, "n": 6},
                      "images_per_s": 700.0, "data_wait_fraction": 0.02},
           "eval": {"accuracy": 0.02, "loss": 4.6, "samples": 256}, "evals": [], "memory": {}, "config": {}}
    record = RunRecord.from_row(old)
    assert record.result.framework_version == "2.14.1" and record.fields == {"rung": "baseline"}
    assert record.result.eval == Evaluation(step=8, accuracy=0.02, loss=4.6, samples=256)
    assert record.result.timing.step_median_s == 0.09 and math.isnan(record.result.memory.get("peak_allocated_bytes"))
    assert record.result.num_classes == 0  # unknown: readers take it from the data


def test_a_failed_run_has_no_evaluation():
    failed = RunResult.failed("torch", "exit code 9")
    assert failed.eval is None and math.isnan(failed.final_loss) and not failed.ok
    assert RunResult.from_row(failed.to_row()) == failed


def test_rows_round_trip_and_older_rows_read_as_not_measured():
    result = RunResult(framework="jax", status="ok", steps_done=2, losses=[2.0, 1.9], step_elapsed_s=[3.0, 3.1],
                       evals=[Evaluation(2, 0.5, 1.0, 64, elapsed_s=3.5, train_s=0.2), Evaluation(2, 0.5, 1.0, 64)],
                       evaluation_s=0.3)
    again = RunResult.from_row(json.loads(json.dumps(result.to_row())))
    assert again.evals == result.evals  # the NaN read back from JSON is NAN again, so they compare equal
    assert (again.step_elapsed_s, again.evaluation_s) == ([3.0, 3.1], 0.3)
    old = {"key": "k", "framework": "torch", "status": "ok", "losses": [2.0],
           "evals": [{"step": 1, "accuracy": 0.1, "loss": 2.0, "samples": 64}]}
    record = RunRecord.from_row(old)
    assert record.result.step_elapsed_s == [] and record.result.evaluation_s is NAN
    assert record.result.evals[0].elapsed_s is NAN and record.fields == {}
    assert record.result.augmentations is None and augmentation_text([record.result]) == (
        "not recorded (rows from before it)")
    assert augmentation_text([result, replace(result, augmentations=["crop"])]) == "crop"  # a new row's
