"""Rows a results folder holds beside its training runs, by key (their writers are in execution/, their
readers in reporting/), and the marks a plan puts on its runs' rows."""

from __future__ import annotations

# The device's measured fp32 matmul rate (FLOP/s): one row per results folder, the denominator of MFU.
MATMUL_RATE_KEY = "device/matmul-rate"
MATMUL_RATE_COMMAND = "device"
# How the adaptive step of a ladder or sweep ended (its precision, time budget, the repeats it added and why it
# stopped): one row per results folder, read by the report's "undecided" list.
ADAPTIVE_KEY = "plan/adaptive"
ADAPTIVE_COMMAND = "plan"
# The A/A control: one configuration run a second time in every repeat, at another place in the order. Its rows carry
# ``control: "aa"``; the report groups them apart (the group's name with AA_SUFFIX) and reads the noise floor from
# how far the two landed apart.
AA = "aa"
AA_SUFFIX = "~aa"


def group_of(fields: dict, group_field: str) -> str:
    """A run row's group (its rung or sweep value), the A/A control's duplicate apart from its original."""
    return str(fields[group_field]) + (AA_SUFFIX if fields.get("control") == AA else "")


def configuration_of(fields: dict) -> str:
    """The group of a ladder's or a sweep's run row (its rung, or its sweep value)."""
    return group_of(fields, "rung" if "rung" in fields else "value")
