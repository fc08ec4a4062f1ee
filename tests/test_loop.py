"""The one training loop and its two backends: the twin contract, what the loop evaluates on, the loop's rules on the
framework-free scripted backend (tests/scripted.py: cadences, early stop, resume offsets, divergence, the fp16
skipped step's LR, the kill hook, scalars), and one tiny real run per framework."""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scripted import STEPS_PER_EPOCH, Scripted, Traced, linear, scalars

from common.config import RunConfig
from common.data.augment import channel_stats, normalise
from common.errors import ConfigError
from common.loop import Backend, Place, fit
from common.schedule import learning_rate
from common.timing import process_start_time
from common.workloads import open_sources
from experiments.catalog.fixtures import write_cifar_archive


def _backend(framework: str):
    if framework == "torch":
        from torch_impl.backend import Backend as Twin
    else:
        from jax_impl.backend import Backend as Twin
    return Twin


def _contract() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(Backend).items()
            if callable(member) and not name.startswith("_")}


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_backends_implement_the_protocol_name_for_name(framework):
    """Every Protocol method, with the same parameter names; nothing public beyond it, so the two read alike."""
    twin = _backend(framework)
    public = {name for name in dir(twin) if not name.startswith("_") and callable(getattr(twin, name))}
    assert public == set(_contract())
    for name, signature in _contract().items():
        assert list(inspect.signature(getattr(twin, name)).parameters) == list(signature.parameters), name
    assert {"name", "version", "device"} <= set(dir(twin)) and twin.name == framework


def test_the_two_backends_have_the_same_shape():
    torch_twin, jax_twin = _backend("torch"), _backend("jax")
    for name in _contract():
        assert inspect.signature(getattr(torch_twin, name)) == inspect.signature(getattr(jax_twin, name)), name


def _as_nhwc(framework: str, images) -> np.ndarray:
    array = np.asarray(images.numpy() if framework == "torch" else images)
    return array.transpose(0, 2, 3, 1) if framework == "torch" else array


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("workers", [0, 2])
def test_evaluation_reads_normalised_unaugmented_test_images_in_file_order(cifar100_archive: Path, framework, workers):
    """The loader the loop evaluates on gives the test split exactly: no crop, no flip, no shuffle, whatever
    the training loader's worker count (a defect once: eval ran on augmented, shuffled test images)."""
    config = RunConfig(data=str(cifar100_archive), batch_size=64, steps=1, epochs=None, workers=workers,
                       prefetch=2, persistent_workers=workers > 0)
    backend = _backend(framework)()
    backend.start(config)
    try:
        train_source, test_source = open_sources(config)
        _, eval_loader = backend.loaders(train_source, test_source)
        batches = list(eval_loader.epoch(0))
    finally:
        backend.finish(clean=True)
    mean, std = channel_stats("cifar100")
    images = np.concatenate([_as_nhwc(framework, x) for x, _ in batches])
    labels = np.concatenate([np.asarray(y) for _, y in batches])
    expected = np.stack([normalise(test_source[i][0], mean, std) for i in range(len(test_source))])
    np.testing.assert_array_equal(labels, [test_source[i][1] for i in range(len(test_source))])
    np.testing.assert_array_equal(images, expected)


def test_reported_accuracy_is_the_accuracy_on_the_test_split(cifar100_archive: Path, tmp_path):
    """End to end (torch): the accuracy fit reports equals one computed here from its final weights on the
    plain test images."""
    import torch

    from common.workloads import arch
    from torch_impl.backend import fit
    from torch_impl.train import make_model

    weights = tmp_path / "final.npz"
    config = RunConfig(data=str(cifar100_archive), model="resnet10", width=0.125, batch_size=32, steps=6, epochs=None,
                       lr=0.05, timing_warmup=1, save_weights=str(weights))
    result = fit(config)
    assert result.ok and result.eval is not None and result.eval.samples == 200
    model = make_model(config.replace(init_weights=str(weights)), arch(config, 100)).cpu().eval()
    _, test_source = open_sources(config)
    mean, std = channel_stats("cifar100")
    images = torch.from_numpy(np.stack([normalise(test_source[i][0], mean, std) for i in range(len(test_source))]))
    labels = np.asarray([test_source[i][1] for i in range(len(test_source))])
    with torch.no_grad():  # in the run's own batches, so even a near-tie rounds the same way on any CPU
        batches = torch.split(images.permute(0, 3, 1, 2).contiguous(), config.batch_size)
        predicted = torch.cat([model(batch).argmax(1) for batch in batches]).numpy()
    assert result.eval.accuracy == pytest.approx(float((predicted == labels).mean()), abs=1e-12)


# --- the loop's rules, on a scripted backend (tests/scripted.py) ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 classes, 64 training and 64 test images: 4 steps an epoch at batch 16, and one shape throughout (no
    short batch for JAX to compile again)."""
    return write_cifar_archive(tmp_path_factory.mktemp("tiny-cifar10"), kind="cifar10", n_train=64, n_test=64, seed=4)


@pytest.fixture()
def config(tiny_archive: Path) -> RunConfig:
    return RunConfig(data=str(tiny_archive), source="cifar10", model="resnet10", width=0.125, batch_size=16, epochs=3,
                     lr=0.05, timing_warmup=1)


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
    backend = Scripted(linear)
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
    result = fit(config.replace(eval_every=1), Scripted(linear))
    elapsed, trained = [e.elapsed_s for e in result.evals], [e.train_s for e in result.evals]
    assert len(result.step_elapsed_s) == len(result.losses) == 12
    assert np.all(np.diff(result.step_elapsed_s) > 0) and np.all(np.diff(elapsed) > 0) and np.all(np.diff(trained) > 0)
    for evaluation, step_end in zip(result.evals, result.step_elapsed_s, strict=True):
        assert 0 < evaluation.train_s < step_end < evaluation.elapsed_s  # the step ended, then it was evaluated
    assert trained[-1] >= 12 * 0.002 and 12 * 0.002 <= result.evaluation_s < elapsed[-1]
    assert result.step_elapsed_s[0] > before  # from this process's start, not the run's


def test_torch_over_several_processes_is_refused_and_spmd_is_not(config):
    with pytest.raises(ConfigError, match="target_accuracy over 2 scripted processes is not built"):
        fit(config.replace(target_accuracy=0.5), Scripted(linear, place=Place(processes=2, spmd=False)))
    spmd = fit(config.replace(target_accuracy=0.4), Scripted(linear, place=Place(processes=2, spmd=True)))
    assert [e.step for e in spmd.evals] == [4, 8]


def test_scalars_of_a_diverged_fp16_run_are_flushed_and_closed(config, tmp_path):
    """The loss scale is written under fp16, and a diverged run's file holds every step up to the blow-up."""
    losses = {1: 2.0, 2: 2.1, 3: math.inf}
    backend = Scripted(linear, loss=lambda step: losses[step])
    result = fit(config.replace(precision="fp16", tensorboard_dir=str(tmp_path)), backend)
    assert result.status == "diverged" and result.evals == []
    series = scalars(tmp_path / "scripted")
    assert [(s.step, s.value) for s in series["train/loss"]] == [(1, 2.0), (2, pytest.approx(2.1)), (3, math.inf)]
    assert [s.value for s in series["train/loss_scale"]] == [1.0] * 3
    assert {"train/lr", "train/step_ms", "train/data_wait_ms"} <= set(series) and "eval/accuracy" not in series


def test_a_resumed_run_crosses_epochs_at_its_offset_with_its_cadences_and_profiler_window(config, tmp_path):
    """Resumed at step 3 of 8, 2 micro-batches a step (2 steps an epoch): the first epoch read starts at batch 2;
    checkpoints every 2 steps, evaluations every 3, the last 2 steps traced (the window opens before the data wait
    of step 6, so before its epoch's iterator is made) and left out of the timing; the last epoch's iterator lives
    until the run's result is made."""
    backend = Traced(start=3)
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
    backend = Traced(start=12)
    result = fit(config, backend)  # 3 epochs of 4 steps
    assert backend.events == [("evaluate", 12), ("finish", True)]
    assert (result.steps_done, result.losses, [e.step for e in result.evals]) == (12, [], [12])


def test_an_fp16_step_skipped_on_overflow_leaves_the_lr_where_it_was(config, tmp_path):
    """The scale falls after steps 2 and 5 (skipped): 12 steps are 10 updates, and each step's LR scalar is the
    schedule's at the updates before it."""
    backend = Traced(scales=lambda step: 2.0 ** -sum(step >= s for s in (2, 5)))
    result = fit(config.replace(precision="fp16", tensorboard_dir=str(tmp_path)), backend)
    assert result.loss_scales == [1.0, 0.5, 0.5, 0.5, 0.25] + [0.25] * 7
    assert result.final_lr == pytest.approx(float(learning_rate(10, config, 12, np)))
    written = [s.value for s in scalars(tmp_path / "scripted")["train/lr"]]
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
    backend = Traced()
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


@pytest.mark.slow
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

    series = scalars(tmp_path / framework)
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


@pytest.mark.parametrize("blow_up", [math.inf, math.nan, 250.0])
def test_a_loss_that_overflows_or_grows_100x_ends_the_run_as_diverged_at_once(config, blow_up):
    """inf, nan, or 125x the first step's 2.0 (finite: BatchNorm can keep a blow-up finite for many steps)."""
    losses = {1: 2.0, 2: 3.0, 3: blow_up}
    backend = Scripted(linear, loss=lambda step: losses.get(step, 2.0))
    result = fit(config.replace(target_accuracy=0.9), backend)
    assert result.status == "diverged" and backend.steps == 3 == len(result.losses)  # stopped at once
    assert result.evals == [] and backend.evaluated == []
