"""The base configurations of the ladder and the sweeps (``--preset``), and how a preset adapts to ``--model`` of
another family: through the data of ``FAMILY_RECIPES`` keyed by the model's workload family, never a branch."""

from __future__ import annotations

from typing import Any

from common.workloads import is_spec, workload_for

PRESETS: dict[str, dict[str, Any]] = {
    # The README's main job (`make run`: 5 rungs and the A/A control x 2 frameworks x 2 repeats, no ablations, then
    # adaptive repeats of the undecided; its time budget, 7 minutes, bounds the second repeat too). Timed
    # steps chosen by measurement (`twinrun ladder --preset cpu --steps 18 --repeats 3`, 2 cores, 2026-12-05): a run
    # costs ~9 s besides its steps (process, imports, compile) and a step 0.04-0.4 s; the spread of log step times is
    # ~0.05 within a run and 0.02-0.09 between runs (processes) of one configuration, so the interval of a
    # configuration narrows far more with runs than with steps: its variance per second of run is least between 6
    # (JAX: its runs vary most) and ~25 (torch's calm runs) timed steps. 8 timed steps: near the optimum for the
    # noisier framework, and a median of 8 shrugs off one slow step. 2 warm-up steps: from the third step on, every
    # step was within 5% of its run's median.
    "cpu": {"model": "resnet18", "width": 0.125, "batch_size": 64, "steps": 10, "epochs": None, "timing_warmup": 2,
            "eval_batches": 2, "lr": 0.05, "warmup_steps": 2},
    # tiny: a smoke run on a CPU (CI's); ResNet-10, one block a stage: ~30% less for XLA to compile than ResNet-18
    "tiny": {"model": "resnet10", "width": 0.125, "batch_size": 16, "steps": 3, "epochs": None, "timing_warmup": 1,
             "eval_batches": 1, "lr": 0.05},
    "article": {"model": "resnet50", "stem": "cifar", "width": 1.0, "batch_size": 128, "steps": 40, "epochs": None,
                "timing_warmup": 10, "eval_batches": 10, "lr": 0.1, "warmup_steps": 5},
}

# What a model family trains with in place of the preset's (a ResNet's SGD recipe), keyed by
# ``workload_for(model).family``: a new family adds a line here, no branch in the driver. A ViT trains with AdamW
# (timm's DeiT recipe: lr 1e-3, weight decay 0.05; SGD at a ResNet's LR learns a transformer poorly). The preset's
# batch, steps and warm-up stay, so both families are measured on the same schedule; its width is the ResNet's
# multiplier, which a ViT ignores (its width is its name's).
FAMILY_RECIPES: dict[str, dict[str, Any]] = {
    "vit": {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.05},
    # BERT's fine-tuning recipe (AdamW, weight decay 0.01), at the ViT's LR: a small encoder trained from scratch
    "text": {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.01},
}


def preset_settings(preset: str, model: str | None = None) -> dict[str, Any]:
    """The preset's RunConfig fields for ``model`` (None: the preset's own); a model of another family than the
    preset's takes that family's recipe over the preset's optimizer settings."""
    settings = dict(PRESETS[preset])
    if model is None or model == settings["model"]:
        return settings
    workload = workload_for(model)  # an unknown model is refused here, by name
    if workload.family != workload_for(settings["model"]).family:
        settings.update(FAMILY_RECIPES.get(workload.family, workload.recipe))
    return {**settings, "model": model}


def model_tag(preset: str, model: str | None) -> str:
    """``-<model>`` (a workload from outside the repository: ``-<family>``) when ``model`` is not the preset's, for
    results folder names: rows of two models never share a folder by default (the store would refuse them anyway,
    as rows of other settings)."""
    if model is None or model == PRESETS[preset]["model"]:
        return ""
    return f"-{workload_for(model).family}" if is_spec(model) else f"-{model}"  # a spec holds slashes and colons
