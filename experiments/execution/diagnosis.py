"""Is a run input-bound, compute-bound or overhead-bound, and the evidence.

Evidence, per framework, from two short isolated runs of the config (four when the doubling ratio lands near
the line):
- the data-wait fraction of the steady-state steps (time blocked on the loader / all step time);
- the batch-doubling test: compute time per step at B and at 2B. Work that scales with the batch
  (compute-bound) nearly doubles it; fixed per-step costs (Python, dispatch, launches) do not;
- GPU utilisation sampled through NVML while the run at B goes on, where a GPU exists;
- a profiler trace of the last steps of the run at B (torch.profiler / jax.profiler) and its top ops.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.config import RunConfig
from common.results import RunResult, Summary
from experiments.catalog.defaults import with_default_data
from experiments.execution.paired import paired_config, run_framework
from experiments.execution.store import atomic_write_text

# The loader stalls the device for at least a quarter of every step: faster compute would not help.
INPUT_BOUND_WAIT = 0.25
# Doubling the batch multiplies compute time by at least this much: the device is busy with the work itself.
# Pure compute gives x2 and pure per-step overhead x1; CPU kernels also get somewhat more efficient with the
# batch, so compute-bound runs measured here give x1.6-1.8 and overhead-bound ones x1.0-1.2.
COMPUTE_BOUND_RATIO = 1.4
# A ratio this near the line is measured once more at both sizes, and the faster median of each size is kept: a
# run slowed as a whole (another process on a shared 2-core machine) moved one CI ratio from ~x1.9 to x1.26
# (368 ms at B=32 where 222-230 ms was measured in four runs before and after); slowdowns only ever add time.
NEAR_THE_LINE = (1.15, 1.7)
# On a GPU, below this median utilisation the device is idle between kernels (overhead), data wait aside.
LOW_GPU_UTILISATION = 50.0


@dataclass
class Diagnosis:
    framework: str
    verdict: str
    evidence: list[str]
    data_wait_fraction: float
    step_ms: float
    compute_ms_at_b: float
    compute_ms_at_2b: float
    doubling_ratio: float
    batch_size: int
    gpu_utilisation: dict[str, float] | None = None
    profile: dict[str, Any] | None = None
    runs: dict[str, str] = field(default_factory=dict)


def classify(data_wait_fraction: float, doubling_ratio: float, gpu_utilisation_median: float | None = None) -> str:
    """The verdict from the measurements (pure, so the thresholds are tested on their own)."""
    if data_wait_fraction >= INPUT_BOUND_WAIT:
        return "input-bound"
    if gpu_utilisation_median is not None and gpu_utilisation_median < LOW_GPU_UTILISATION:
        return "overhead-bound"
    return "compute-bound" if doubling_ratio >= COMPUTE_BOUND_RATIO else "overhead-bound"


class GpuSampler:
    """Samples NVML's GPU utilisation (percent of time a kernel ran) in a thread; a no-op without a GPU."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.unavailable: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml  # optional (the gpu extra): imported only where a sampler is made

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception as exc:  # no pynvml, no driver or no GPU: say so, never crash
            self.unavailable = f"NVML not available ({type(exc).__name__}): no GPU utilisation sampled"

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            time.sleep(self.interval_s)

    def __enter__(self) -> GpuSampler:
        if self.unavailable is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict[str, float] | None:
        if not self.samples:
            return None
        # Samples span the whole process, start-up and compilation included; the p90 shows the busy phase.
        ordered = sorted(self.samples)
        return {"median": statistics.median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))], "n": len(ordered)}


def diagnosis_config(config: RunConfig) -> RunConfig:
    """A short run of ``config``: 12 steps unless given, one evaluation batch (accuracy is not the point)."""
    config = with_default_data(config)
    if config.steps is None:
        config = config.replace(steps=12, epochs=None)
    return config.replace(eval_batches=1, profile_steps=0, profile_dir=None)  # diagnose() adds the traced steps


def _run(framework: str, config: RunConfig, timeout_s: float | None) -> tuple[RunResult, Summary]:
    """A finished run and its compute-time summary (an error if it failed or timed no step)."""
    result = run_framework(framework, config, timeout_s)
    if not result.ok:
        raise RuntimeError(f"{framework} run at batch {config.batch_size} {result.status}: {result.error or ''}")
    if result.timing.compute_s is None:
        raise RuntimeError(f"{framework} run at batch {config.batch_size} timed no step: give more steps than "
                           f"timing_warmup ({config.timing_warmup})")
    return result, result.timing.compute_s


def _profile_line(profile: dict[str, Any] | None) -> str | None:
    if not profile or not profile.get("top_ops"):
        return None
    top = ", ".join(f"{op['name']} {op['ms']:.1f} ms" for op in profile["top_ops"][:3])
    return (f"profiler ({profile['tool']}, {profile['steps']} steps, by {profile['ranked_by']}): {top}; "
            f"trace {profile['trace']}")


def diagnose(framework: str, config: RunConfig, out: Path, profile_steps: int = 3,
             timeout_s: float | None = None) -> Diagnosis:
    # Torch's initial weights for both frameworks: the same starting point, and Flax's own jitted init
    # would cost a 6 s compilation (XLA:CPU, its random initializers) in every run.
    config = paired_config(config, out / "weights")
    traced = config.replace(profile_steps=profile_steps, profile_dir=str(out / framework / "profile"),
                            steps=(config.steps or 0) + profile_steps)
    with GpuSampler() as sampler:
        at_b, compute_b = _run(framework, traced, timeout_s)
    doubled = config.replace(batch_size=2 * config.batch_size)
    _, compute_2b = _run(framework, doubled, timeout_s)
    wait = at_b.timing.data_wait_fraction
    median_b, median_2b = compute_b.median, compute_2b.median
    remeasured = NEAR_THE_LINE[0] <= median_2b / median_b <= NEAR_THE_LINE[1]
    if remeasured:
        median_b = min(median_b, _run(framework, config, timeout_s)[1].median)
        median_2b = min(median_2b, _run(framework, doubled, timeout_s)[1].median)
    ratio = median_2b / median_b
    gpu = sampler.summary()
    verdict = classify(wait, ratio, gpu["median"] if gpu else None)
    evidence = [
        f"data wait: {100 * wait:.1f}% of each steady-state step (input-bound from {100 * INPUT_BOUND_WAIT:.0f}%)",
        f"batch doubling: compute {median_b * 1e3:.1f} ms at B={config.batch_size} -> "
        f"{median_2b * 1e3:.1f} ms at 2B, x{ratio:.2f} (x2 = all work scales with the batch: compute-bound "
        f"from x{COMPUTE_BOUND_RATIO}; x1 = fixed per-step costs: overhead-bound)"
        + (f"; measured twice at each size, the faster kept (the first ratio, "
           f"x{compute_2b.median / compute_b.median:.2f}, was near the line)" if remeasured else ""),
        f"GPU utilisation (NVML, whole run): median {gpu['median']:.0f}%, p90 {gpu['p90']:.0f}%" if gpu
        else (sampler.unavailable or "GPU utilisation: no samples"),
    ]
    profile_line = _profile_line(at_b.profile)
    if profile_line:
        evidence.append(profile_line)
    return Diagnosis(framework=framework, verdict=verdict, evidence=evidence, data_wait_fraction=wait,
                     step_ms=at_b.timing.step_median_s * 1e3, compute_ms_at_b=median_b * 1e3,
                     compute_ms_at_2b=median_2b * 1e3, doubling_ratio=ratio, batch_size=config.batch_size,
                     gpu_utilisation=gpu, profile=at_b.profile, runs={"device": str(at_b.device)})


def write_diagnoses(path: Path, config: RunConfig, diagnoses: list[Diagnosis]) -> Path:
    text = json.dumps({"config": config.to_dict(), "diagnoses": [asdict(d) for d in diagnoses]}, indent=1, default=str)
    atomic_write_text(path, text)
    return path
