"""Time to accuracy and learning curves (issue 14): the loop's evaluation cadence and early stop, the wall-clock
fields, the TensorBoard scalars (read back with tensorboard's own reader), the accuracy verdict and the curves
plot.

The cadence is checked on a scripted backend (no framework: every case in milliseconds); one tiny real run per
framework then checks the same through both twins."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from common.config import RunConfig
from common.errors import ConfigError
from common.loop import Place, fit
from common.results import NAN, Compilation, Evaluation, Memory, RunResult
from common.schedule import learning_rate
from common.timing import process_start_time
from experiments.catalog.fixtures import write_cifar_archive
from experiments.cli import add_config_arguments, config_from_args
from experiments.execution.record import RunRecord
from experiments.reporting.accuracy import time_to_target, verdict
from experiments.reporting.curves import plot_curves
from experiments.reporting.tables import augmentation_text

STEPS_PER_EPOCH = 4  # 64 training images in batches of 16


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 classes, 64 training and 64 test images: 4 steps an epoch at batch 16, and one shape throughout (no
    short batch for JAX to compile again)."""
    return write_cifar_archive(tmp_path_factory.mktemp("tiny-cifar10"), kind="cifar10", n_train=64, n_test=64, seed=4)


@pytest.fixture()
def config(tiny_archive: Path) -> RunConfig:
    return RunConfig(data=str(tiny_archive), source="cifar10", width=0.125, batch_size=16, epochs=3, lr=0.05,
                     timing_warmup=1)


# --- the loop, on a scripted backend -------------------------------------------------------------------------------


class _Loader:
    def __init__(self, batches: int) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return self.batches

    def epoch(self, epoch: int, start_batch: int = 0):
        for _ in range(start_batch, self.batches):
            yield np.zeros((16, 1), np.float32), np.zeros(16, np.int32)


class _Scripted:
    """A Backend whose accuracy after each step is scripted: the loop's decisions, with no framework."""

    name, version, device = "scripted", "0", "cpu"

    def __init__(self, accuracy: Callable[[int], float], loss: Callable[[int], float] = lambda step: 2.0,
                 place: Place | None = None) -> None:
        self.accuracy, self.loss, self.place = accuracy, loss, place or Place()
        self.evaluated: list[int] = []
        self.steps = 0

    def start(self, config: RunConfig) -> Place:
        return self.place

    def loaders(self, train_source, eval_source):
        return _Loader(STEPS_PER_EPOCH), _Loader(1)

    def build(self, arch, total_steps: int):
        return 0, []

    def to_device(self, group):
        return group

    def step(self, group, inject_inf: bool) -> float:
        time.sleep(0.002)  # a step takes time, so train_s grows
        self.steps += 1
        return self.loss(self.steps)

    def loss_scale(self) -> float:
        return 1.0

    def save(self, folder: str, step: int) -> None: ...

    def gather(self) -> None: ...

    def evaluate(self, loader, step: int) -> Evaluation:
        time.sleep(0.002)
        self.evaluated.append(step)
        return Evaluation(step=step, accuracy=self.accuracy(step), loss=1.0, samples=64)

    def memory(self, first) -> Memory:
        return Memory()

    def profiler(self, folder: str):
        raise AssertionError("not profiled here")

    def save_weights(self, path: str) -> None: ...

    def compilation(self) -> Compilation:
        return Compilation()

    def finish(self, clean: bool) -> None: ...


def _linear(step: int) -> float:
    return step / 20  # 0.2 after the first epoch, 0.4 after the second, ...


@pytest.mark.parametrize("target,eval_every,evaluated", [
    (0.4, 0, [4, 8]),  # the second epoch end reaches it
    (0.3, 3, [3, 4, 6]),  # an --eval-every evaluation reaches it mid-epoch
    (0.6, 0, [4, 8, 12]),  # reached by the final evaluation: not evaluated twice at the last step
    (0.99, 4, [4, 8, 12]),  # never reached: eval_every on the epoch ends adds nothing twice
    (None, 4, [4, 8, 12]),  # no target: as before, the final evaluation is the last step's only one
    (None, 0, [12]),
])
def test_evaluates_at_epoch_ends_and_stops_at_the_first_that_reaches_the_target(config, target, eval_every,
                                                                                 evaluated):
    backend = _Scripted(_linear)
    result = fit(config.replace(target_accuracy=target, eval_every=eval_every), backend)
    assert backend.evaluated == evaluated and [e.step for e in result.evals] == evaluated
    assert result.status == "ok" and result.steps_done == evaluated[-1] == len(result.losses)
    if target is not None:
        reached = [e.step for e in result.evals if e.accuracy >= target]
        assert reached in ([], [evaluated[-1]])  # stopped at the first evaluation that reached it
        expected = f"reached at step {evaluated[-1]} of 12" if reached else "not reached in 12 steps"
        assert any(expected in note for note in result.notes), result.notes


def test_evaluations_carry_seconds_since_the_process_started_and_of_training(config):
    before = time.time() - process_start_time()
    result = fit(config.replace(eval_every=1), _Scripted(_linear))
    elapsed, trained = [e.elapsed_s for e in result.evals], [e.train_s for e in result.evals]
    assert len(result.step_elapsed_s) == len(result.losses) == 12
    assert np.all(np.diff(result.step_elapsed_s) > 0) and np.all(np.diff(elapsed) > 0) and np.all(np.diff(trained) > 0)
    for evaluation, step_end in zip(result.evals, result.step_elapsed_s, strict=True):
        assert 0 < evaluation.train_s < step_end < evaluation.elapsed_s  # the step ended, then it was evaluated
    assert trained[-1] >= 12 * 0.002 and 12 * 0.002 <= result.evaluation_s < elapsed[-1]
    assert result.step_elapsed_s[0] > before  # from this process's start, not the run's


def test_torch_over_several_processes_is_refused_and_spmd_is_not(config):
    with pytest.raises(ConfigError, match="target_accuracy over 2 scripted processes is not built"):
        fit(config.replace(target_accuracy=0.5), _Scripted(_linear, place=Place(processes=2, spmd=False)))
    spmd = fit(config.replace(target_accuracy=0.4), _Scripted(_linear, place=Place(processes=2, spmd=True)))
    assert [e.step for e in spmd.evals] == [4, 8]


def _scalars(folder: Path) -> dict[str, list]:
    """Every scalar series under ``folder``, read with tensorboard's own reader (all events kept)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    reader = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    reader.Reload()
    return {tag: reader.Scalars(tag) for tag in reader.Tags()[SCALARS]}


def test_scalars_of_a_diverged_fp16_run_are_flushed_and_closed(config, tmp_path):
    """The loss scale is written under fp16, and a diverged run's file holds every step up to the blow-up."""
    losses = {1: 2.0, 2: 2.1, 3: math.inf}
    backend = _Scripted(_linear, loss=lambda step: losses[step])
    result = fit(config.replace(precision="fp16", tensorboard_dir=str(tmp_path)), backend)
    assert result.status == "diverged" and result.evals == []
    series = _scalars(tmp_path / "scripted")
    assert [(s.step, s.value) for s in series["train/loss"]] == [(1, 2.0), (2, pytest.approx(2.1)), (3, math.inf)]
    assert [s.value for s in series["train/loss_scale"]] == [1.0] * 3
    assert {"train/lr", "train/step_ms", "train/data_wait_ms"} <= set(series) and "eval/accuracy" not in series


class _Traced(_Scripted):
    """A scripted backend that writes down what the loop asks of it, in order: each epoch's iterator as it is made
    and as it ends, steps, checkpoints, evaluations, the profiler's window; ``start`` is the step build resumes at,
    and ``scales`` the fp16 loss scale after each step (a fall: that step was skipped)."""

    def __init__(self, start: int = 0, scales: Callable[[int], float] = lambda step: 1.0) -> None:
        super().__init__(_linear)
        self.resume_at, self.scales, self.events = start, scales, []

    def loaders(self, train_source, eval_source):
        events = self.events

        class Loader(_Loader):
            def epoch(self, epoch: int, start_batch: int = 0):
                events.append(("epoch", epoch, start_batch))

                def batches():
                    try:
                        yield from _Loader.epoch(self, epoch, start_batch)
                    finally:
                        events.append(("closed", epoch))

                return batches()

        return Loader(STEPS_PER_EPOCH), _Loader(1)

    def build(self, arch, total_steps: int):
        self.steps = self.resume_at
        return self.resume_at, []

    def step(self, group, inject_inf: bool) -> float:
        self.events.append(("step", self.steps, len(group)))
        return super().step(group, inject_inf)

    def loss_scale(self) -> float:
        return self.scales(self.steps)

    def save(self, folder: str, step: int) -> None:
        self.events.append(("save", step))

    def evaluate(self, loader, step: int) -> Evaluation:
        self.events.append(("evaluate", step))
        return super().evaluate(loader, step)

    def profiler(self, folder: str):
        events = self.events

        class Profiler:
            def start(self) -> None:
                events.append(("profiler", "start"))

            def step(self) -> None:
                events.append(("profiler", "step"))

            def stop(self) -> dict:
                events.append(("profiler", "stop"))
                return {"trace": folder}

        return Profiler()

    def finish(self, clean: bool) -> None:
        self.events.append(("finish", clean))


def test_a_resumed_run_crosses_epochs_at_its_offset_with_its_cadences_and_profiler_window(config, tmp_path):
    """Resumed at step 3 of 8, 2 micro-batches a step (2 steps an epoch): the first epoch read starts at batch 2;
    checkpoints every 2 steps, evaluations every 3, the last 2 steps traced (the window opens before the data wait
    of step 6, so before its epoch's iterator is made) and left out of the timing; the last epoch's iterator lives
    until the run's result is made."""
    backend = _Traced(start=3)
    result = fit(config.replace(steps=8, epochs=None, grad_accum_steps=2, eval_every=3, checkpoint_every=2,
                                checkpoint_dir=str(tmp_path), profile_steps=2, profile_dir=str(tmp_path)), backend)
    assert backend.events == [
        ("epoch", 1, 2), ("step", 3, 2), ("save", 4), ("closed", 1),
        ("epoch", 2, 0), ("step", 4, 2), ("step", 5, 2), ("save", 6), ("evaluate", 6),
        ("profiler", "start"), ("closed", 2),
        ("epoch", 3, 0), ("step", 6, 2), ("profiler", "step"), ("step", 7, 2), ("profiler", "step"), ("save", 8),
        ("profiler", "stop"), ("evaluate", 8), ("closed", 3), ("finish", True)]
    assert (result.status, result.start_step, result.steps_done, len(result.losses)) == ("ok", 3, 8, 5)
    assert result.timing.timed_steps == 3 - config.timing_warmup and result.profile == {"trace": str(tmp_path)}
    assert "resumed from step 3" in result.notes
    assert result.augmentations == ["crop", "flip"]  # the train source's (CIFAR-10), in the row


def test_a_run_resumed_at_its_last_step_reads_no_batch_and_evaluates_once(config):
    backend = _Traced(start=12)
    result = fit(config, backend)  # 3 epochs of 4 steps
    assert backend.events == [("evaluate", 12), ("finish", True)]
    assert (result.steps_done, result.losses, [e.step for e in result.evals]) == (12, [], [12])


def test_an_fp16_step_skipped_on_overflow_leaves_the_lr_where_it_was(config, tmp_path):
    """The scale falls after steps 2 and 5 (skipped): 12 steps are 10 updates, and each step's LR scalar is the
    schedule's at the updates before it."""
    backend = _Traced(scales=lambda step: 2.0 ** -sum(step >= s for s in (2, 5)))
    result = fit(config.replace(precision="fp16", tensorboard_dir=str(tmp_path)), backend)
    assert result.loss_scales == [1.0, 0.5, 0.5, 0.5, 0.25] + [0.25] * 7
    assert result.final_lr == pytest.approx(float(learning_rate(10, config, 12, np)))
    written = [s.value for s in _scalars(tmp_path / "scripted")["train/lr"]]
    updates = [0, 1, 1, 2, 3, 3] + list(range(4, 10))  # before each step
    assert written == pytest.approx([float(learning_rate(u, config, 12, np)) for u in updates])


def test_the_kill_hook_exits_after_its_step_and_its_checkpoint(config, tmp_path, monkeypatch):
    """fail_after_step dies like a killed process (os._exit, here an exception) once its step's checkpoint is
    written."""

    class Killed(Exception):
        pass

    def exit_(status: int) -> None:
        raise Killed(status)

    import common.loop

    monkeypatch.setattr(common.loop.os, "_exit", exit_)
    backend = _Traced()
    with pytest.raises(Killed, match="9"):
        fit(config.replace(fail_after_step=6, checkpoint_every=3, checkpoint_dir=str(tmp_path)), backend)
    assert [e for e in backend.events if e[0] in ("step", "save", "evaluate", "finish")] == [
        ("step", 0, 1), ("step", 1, 1), ("step", 2, 1), ("save", 3), ("step", 3, 1), ("step", 4, 1), ("step", 5, 1),
        ("save", 6), ("finish", False)]

def test_no_folder_imports_nothing_and_tensorboardx_leaves_torch_unloaded(tmp_path):
    """A JAX process writes scalars without loading torch (tensorboardX's writer.py tries to import it)."""
    code = ("import sys\nfrom common.scalars import Scalars\n"
            "Scalars(None, 'jax').close()\nassert 'tensorboardX' not in sys.modules\n"
            f"Scalars({str(tmp_path)!r}, 'jax').close()\n"
            "assert 'tensorboardX' in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
    assert len(list((tmp_path / "jax").glob("events.out.tfevents.*"))) == 1


def test_process_start_time_is_this_process_start():
    """A fresh interpreter started just now reads its own start within its start-up time (and /proc's 10 ms
    ticks), not the time it imported common.timing."""
    code = "import time\nfrom common.timing import process_start_time\nprint(time.time() - process_start_time())"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent).stdout
    since = float(out)
    assert 0 < since <= time.time() - before + 0.05


# --- one tiny real run per framework --------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_real_run_stops_at_the_target_and_its_scalars_match_the_result(config, framework, tmp_path):
    """Target 0.01: one right answer in 64, which any network reaches at once (a constant guess gets ~10%), so
    the first epoch end stops a run of 3 epochs."""
    if framework == "torch":
        from torch_impl.backend import fit as twin
    else:
        from jax_impl.backend import fit as twin
    run = config.replace(target_accuracy=0.01, tensorboard_dir=str(tmp_path),
                         compile="compiled" if framework == "jax" else "eager")  # JAX op by op is ~50x slower
    result = twin(run)
    assert result.status == "ok" and result.steps_done == STEPS_PER_EPOCH == len(result.losses)
    (evaluation,) = result.evals
    assert evaluation.step == STEPS_PER_EPOCH and evaluation.accuracy >= 0.01
    assert 0 < evaluation.train_s < result.step_elapsed_s[-1] < evaluation.elapsed_s
    assert len(result.step_elapsed_s) == len(result.losses) and np.all(np.diff(result.step_elapsed_s) > 0)
    assert 0 < result.evaluation_s < evaluation.elapsed_s - result.step_elapsed_s[-1] + 1e-3
    assert any(f"reached at step {STEPS_PER_EPOCH} of {3 * STEPS_PER_EPOCH}" in n for n in result.notes)

    series = _scalars(tmp_path / framework)
    loss = series["train/loss"]
    assert [s.step for s in loss] == [1, 2, 3, 4]
    np.testing.assert_allclose([s.value for s in loss], result.losses, rtol=1e-6)  # stored as float32
    lrs = [float(learning_rate(i, run, 3 * STEPS_PER_EPOCH, np)) for i in range(STEPS_PER_EPOCH)]
    np.testing.assert_allclose([s.value for s in series["train/lr"]], lrs, rtol=1e-6)
    start = process_start_time()  # this process's: the run was in it
    np.testing.assert_allclose([s.wall_time - start for s in loss], result.step_elapsed_s, atol=1e-3)
    assert [(s.step, s.value) for s in series["eval/accuracy"]] == [(4, pytest.approx(evaluation.accuracy))]
    assert [s.value for s in series["eval/loss"]] == [pytest.approx(evaluation.loss, rel=1e-6)]
    assert all(s.value > 0 for s in series["train/step_ms"]) and len(series["train/data_wait_ms"]) == 4
    assert "train/loss_scale" not in series  # fp32 has none


# --- rows, config and flags ------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("value", [0, -0.1, 1.5, math.nan])
def test_target_accuracy_must_be_a_fraction(value):
    with pytest.raises(ConfigError, match="target_accuracy must be in \\(0, 1\\]"):
        RunConfig(target_accuracy=value)


def test_target_flags_and_synthetic_data():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    config = config_from_args(parser.parse_args(["--to-accuracy", "0.6", "--tensorboard-dir", "tb"]))
    assert (config.target_accuracy, config.tensorboard_dir) == (0.6, "tb")
    assert RunConfig.from_dict({"target_accuracy": 1}).target_accuracy == 1.0
    with pytest.raises(ConfigError, match="target_accuracy needs real labels"):
        RunConfig(source="synthetic", target_accuracy=0.5)


# --- the verdict and the plot ---------------------------------------------------------------------------------------


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
