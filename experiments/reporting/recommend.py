"""The ladder's answer in words: per framework, the configuration with the fewest techniques among those not
detectably slower than the fastest (reporting/analysis.py picks it), its gain over the baseline with its interval,
what it is tied with, and the exact ``twinrun run`` command that reproduces it; or that the data cannot support a
recommendation. And what a technique the hardware emulates costs here."""

from __future__ import annotations

import math
import shlex
from dataclasses import Field, dataclass, fields

from common.config import RunConfig
from experiments.cli import flags_of
from experiments.execution.host import Capabilities, emulation
from experiments.reporting.analysis import Analysis, Recommendation
from experiments.reporting.cells import Cell, Cells
from experiments.reporting.stats import Comparison, Estimate

# RunConfig fields a reproducing command leaves out: the paired weights `twinrun run` makes again from the seed,
# outputs, and test hooks.
NOT_REPRODUCED = ("init_weights", "save_weights", "tensorboard_dir", "profile_dir", "checkpoint_dir",
                  "fail_after_step", "inject_inf_at_step")


def flag_of(f: Field) -> str:
    """The long flag of a RunConfig field (its first spelling that is one)."""
    return next(s for s in flags_of(f) if s.startswith("--"))


def run_command(config: RunConfig, framework: str) -> str:
    """``twinrun run`` flags that rebuild ``config`` (every field that differs from RunConfig's default)."""
    default = RunConfig()
    words = ["twinrun", "run", "--framework", framework]
    for f in fields(RunConfig):
        value = getattr(config, f.name)
        if f.name in NOT_REPRODUCED or value == getattr(default, f.name):
            continue
        flag = flag_of(f)
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, "none" if value is None else str(value)]
    return shlex.join(words)


def title_of(cell: Cell | None) -> str:
    """A configuration's name with its techniques: "top - amp (loader, flags, compile)"."""
    example = cell.example if cell is not None else None
    if example is None:
        return "?"
    ablation = example.fields.get("ablation")
    techniques = example.fields.get("techniques") or []
    name = f"top - {ablation}" if ablation else str(example.fields.get("rung"))
    return f"{name} ({', '.join(techniques) or 'no technique'})"


@dataclass(frozen=True)
class Answer:
    """The recommendation in words, per framework: what to run (with the command that rebuilds it), what it is tied
    with, and its gain over the baseline with the interval; or that the data cannot support one."""

    recommendation: Recommendation
    cells: Cells
    estimates: dict[tuple[str, str], Estimate]
    measure: str = "step time"  # or "time to accuracy"

    def _value(self, group: str) -> str:
        estimate = self.estimates[(group, self.recommendation.framework)]
        lo, hi = estimate.interval()
        scale, unit = (1e3, "ms a step") if self.measure == "step time" else (1.0, "s to the target accuracy")
        bounds = f" [{lo * scale:.1f}, {hi * scale:.1f}]" if math.isfinite(lo) else " (no interval)"
        return f"{estimate.value * scale:.1f} {unit}{bounds}"

    @property
    def command(self) -> str:
        rec = self.recommendation
        example = self.cells[(rec.chosen, rec.framework)].example
        assert example is not None
        return run_command(RunConfig.from_dict(example.config), rec.framework)

    def line(self) -> str:
        rec = self.recommendation
        chosen = self.cells[(rec.chosen, rec.framework)]
        tied = (f"; tied with (not detectably slower than the fastest, {rec.fastest}): "
                f"{', '.join(rec.tied)}" if rec.tied else "; no other configuration is tied with it")
        if rec.chosen == "baseline":
            return (f"{rec.framework}: no recommendation the data can support: the baseline ({self._value('baseline')})"
                    f" is not detectably slower than the fastest configuration measured ({rec.fastest}, "
                    f"{self._value(rec.fastest)}), so no technique buys a detectable gain in {self.measure} here{tied}")
        gain = rec.against_baseline
        assert gain is not None
        if not rec.supported:
            return (f"{rec.framework}: no recommendation the data can support: the simplest of the fastest "
                    f"configurations, {title_of(chosen)} ({self._value(rec.chosen)}), against the baseline: "
                    f"{gain.text()}{tied}")
        return (f"{rec.framework}: recommended: {title_of(chosen)}, {self._value(rec.chosen)}, against the baseline "
                f"{gain.text()} ({gain.speedup_text()}){tied}. Reproduce: `{self.command}`")


def on_gpu(device: str) -> bool:
    return "cuda" in device.lower() or "gpu" in device.lower()


@dataclass(frozen=True)
class Emulated:
    why: str  # "bf16 emulated on this device (CPU without ...)"
    cost: Comparison | None  # its step time against the same techniques in fp32 (None: that run is not measured)

    def text(self) -> str:
        if self.cost is None:
            return self.why
        return f"{self.why}: against the same techniques in fp32, {self.cost.text()}"

    def short(self) -> str:
        if self.cost is None or not math.isfinite(self.cost.ratio):
            return "emulated here"
        return f"emulated here: {100 * (self.cost.ratio - 1):+.0f}% vs fp32"


def emulation_cost(cells: Cells, group: str, framework: str, analysis: Analysis | None = None) -> Emulated | None:
    """For a cell whose dtype the hardware emulates: why, and its measured cost against the cell with the same
    techniques but mixed precision (fp32), with its interval; None when native (or not known, rows from before
    capabilities)."""
    cell = cells.get((group, framework))
    if cell is None or cell.example is None:
        return None
    example = cell.example
    precision = str(example.config.get("precision"))
    why = emulation(precision, on_gpu(example.result.device), Capabilities.from_dict(example.host.get("capabilities")))
    if why is None:
        return None
    techniques = set(example.fields.get("techniques") or [])
    without = [g for (g, fw), c in cells.items() if fw == framework and c.example is not None and not c.control
               and set(c.example.fields.get("techniques") or []) == techniques - {"amp"}]
    if not without or analysis is None or (without[0], framework) not in analysis.estimates:
        return Emulated(why, None)
    return Emulated(why, analysis.compare((without[0], framework), (group, framework)))
