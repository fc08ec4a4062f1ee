"""The ladder's answer: per framework, the fastest configuration measured (cumulative rungs and ablations alike),
its speedup over the baseline, and the exact ``twinrun run`` command that reproduces it; and what a technique
the hardware emulates costs here."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, fields

from common.capabilities import Capabilities, emulation
from common.cli import FLAG_ALIASES
from common.config import RunConfig
from experiments.execution.frameworks import FRAMEWORKS
from experiments.reporting.cells import NAN, Cell, Cells

# RunConfig fields a reproducing command leaves out: the paired weights `twinrun run` makes again from the seed,
# outputs, and test hooks.
NOT_REPRODUCED = ("init_weights", "save_weights", "tensorboard_dir", "profile_dir", "checkpoint_dir",
                  "fail_after_step", "inject_inf_at_step")


def flag_of(name: str) -> str:
    """The long flag of a RunConfig field (common/cli.py's spelling)."""
    spellings = FLAG_ALIASES.get(name, ("--" + name.replace("_", "-"),))
    return next(s for s in spellings if s.startswith("--"))


def run_command(config: RunConfig, framework: str) -> str:
    """``twinrun run`` flags that rebuild ``config`` (every field that differs from RunConfig's default)."""
    default = RunConfig()
    words = ["twinrun", "run", "--framework", framework]
    for f in fields(RunConfig):
        value = getattr(config, f.name)
        if f.name in NOT_REPRODUCED or value == getattr(default, f.name):
            continue
        flag = flag_of(f.name)
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, "none" if value is None else str(value)]
    return shlex.join(words)


@dataclass(frozen=True)
class Choice:
    framework: str
    group: str  # the rung or ablation's name
    title: str
    value: float  # what was ranked: median step seconds, or median seconds to the target accuracy
    baseline: float
    command: str
    measure: str  # "step time" | "time to accuracy"

    @property
    def speedup(self) -> float:
        return self.baseline / self.value if self.value else NAN

    def line(self) -> str:
        unit = "ms a step" if self.measure == "step time" else "s to the target accuracy"
        scale = 1e3 if self.measure == "step time" else 1.0
        return (f"{self.framework}: fastest configuration measured: {self.title} ({self.value * scale:.1f} {unit}, "
                f"{self.speedup:.2f}x the baseline's {self.baseline * scale:.1f}). Reproduce: `{self.command}`")


def title_of(cell: Cell) -> str:
    example = cell.example
    if example is None:
        return "?"
    ablation = example.fields.get("ablation")
    techniques = example.fields.get("techniques") or []
    name = f"top - {ablation}" if ablation else str(example.fields.get("rung"))
    return f"{name} ({', '.join(techniques) or 'no technique'})"


def fastest(cells: Cells, score: dict[tuple[str, str], float] | None = None,
            measure: str = "step time") -> list[Choice]:
    """Per framework, the cell with the lowest score (default: median step time) among those measured."""
    choices = []
    for framework in FRAMEWORKS:
        mine = {group: cell for (group, fw), cell in cells.items() if fw == framework and cell.example is not None}
        values = {g: score.get((g, framework), NAN) if score is not None else c.step_s for g, c in mine.items()}
        values = {g: v for g, v in values.items() if math.isfinite(v)}
        if not values or "baseline" not in mine:
            continue
        group = min(values, key=values.__getitem__)
        config = RunConfig.from_dict(mine[group].example.config)  # type: ignore[union-attr]
        choices.append(Choice(framework, group, title_of(mine[group]), values[group],
                              values.get("baseline", NAN), run_command(config, framework), measure))
    return choices


def on_gpu(device: str) -> bool:
    return "cuda" in device.lower() or "gpu" in device.lower()


@dataclass(frozen=True)
class Emulated:
    why: str  # "bf16 emulated on this device (CPU without ...)"
    cost: float  # step time against the same techniques in fp32, minus 1 (NaN: that run is not measured)

    def text(self) -> str:
        if math.isnan(self.cost):
            return self.why
        return f"{self.why}: {self.cost * 100:+.0f}% step time against the same techniques in fp32"

    def short(self) -> str:
        return "emulated here" + ("" if math.isnan(self.cost) else f": {self.cost * 100:+.0f}% vs fp32")


def emulation_cost(cells: Cells, group: str, framework: str) -> Emulated | None:
    """For a cell whose dtype the hardware emulates: why, and its measured cost against the cell with the same
    techniques but mixed precision (fp32); None when native (or not known, rows from before capabilities)."""
    cell = cells.get((group, framework))
    if cell is None or cell.example is None:
        return None
    example = cell.example
    precision = str(example.config.get("precision"))
    why = emulation(precision, on_gpu(example.result.device), Capabilities.from_dict(example.host.get("capabilities")))
    if why is None:
        return None
    techniques = set(example.fields.get("techniques") or [])
    without = [c.step_s for (g, fw), c in cells.items() if fw == framework and c.example is not None
               and set(c.example.fields.get("techniques") or []) == techniques - {"amp"}]
    return Emulated(why, cell.step_s / without[0] - 1 if without else NAN)
