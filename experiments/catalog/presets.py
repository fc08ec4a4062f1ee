"""The base configurations of the ladder and the sweeps (``--preset``)."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # The README's main job (`make run`: 8 rungs and ablations x 2 frameworks x 2 repeats): small enough for 2 CPU
    # cores in 8 minutes; 4 timed steps a run, 8 a cell. At 8 steps and 4 eval batches it took 8 min 38 s.
    "cpu": {"model": "resnet18", "width": 0.125, "batch_size": 64, "steps": 6, "epochs": None, "timing_warmup": 2,
            "eval_batches": 2, "lr": 0.05, "warmup_steps": 2},
    "tiny": {"model": "resnet18", "width": 0.125, "batch_size": 16, "steps": 3, "epochs": None, "timing_warmup": 1,
             "eval_batches": 1, "lr": 0.05},
    "article": {"model": "resnet50", "stem": "cifar", "width": 1.0, "batch_size": 128, "steps": 40, "epochs": None,
                "timing_warmup": 10, "eval_batches": 10, "lr": 0.1, "warmup_steps": 5},
}
