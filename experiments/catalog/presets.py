"""The base configurations of the ladder and the sweeps (``--preset``)."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # The README's main job: small enough for 2 CPU cores in <= 10 minutes with 3 repeats.
    "cpu": {"model": "resnet18", "width": 0.125, "batch_size": 64, "steps": 8, "epochs": None, "timing_warmup": 2,
            "eval_batches": 4, "lr": 0.05, "warmup_steps": 2},
    "tiny": {"model": "resnet18", "width": 0.125, "batch_size": 16, "steps": 3, "epochs": None, "timing_warmup": 1,
             "eval_batches": 1, "lr": 0.05},
    "article": {"model": "resnet50", "stem": "cifar", "width": 1.0, "batch_size": 128, "steps": 40, "epochs": None,
                "timing_warmup": 10, "eval_batches": 10, "lr": 0.1, "warmup_steps": 5},
}
