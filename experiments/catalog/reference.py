"""Published figures the ladder is compared with, labelled as such (never mixed with our measurements)."""

from __future__ import annotations

SOURCE = ("the case study this project reproduces: ResNet-50, CIFAR-100, batch 128, one RTX 3090, PyTorch; "
          "figures as quoted in the project's ladder issue")
# Minutes of training per rung (baseline, + loader, + flags, + mixed precision, + compile).
MINUTES = {"baseline": 52.0, "loader": 36.0, "flags": 33.0, "amp": 19.0, "compile": 15.0}
# The case study also quotes step times 260 -> 220 -> 130 -> 110 ms and GPU utilisation 47 -> 71 -> 92 %
# over its rungs without a one-to-one mapping to all five, so they are shown as text, not per row.
STEP_MS_TEXT = "260 -> 220 -> 130 -> 110 ms a step"
GPU_UTILISATION_TEXT = "GPU utilisation 47 -> 71 -> 92 %"
