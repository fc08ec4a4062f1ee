"""Rows a results folder holds beside its training runs, by key (their writers are in execution/, their
readers in reporting/)."""

from __future__ import annotations

# The device's measured fp32 matmul rate (FLOP/s): one row per results folder, the denominator of MFU.
MATMUL_RATE_KEY = "device/matmul-rate"
MATMUL_RATE_COMMAND = "device"
