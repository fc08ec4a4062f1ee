"""``twinrun diagnose``: is a run input-bound, compute-bound or overhead-bound, and the evidence.

Evidence, per framework, from two short isolated runs of the config:
- the data-wait fraction of the steady-state steps (time blocked on the loader / all step time);
- the batch-doubling test: compute time per step at B and at 2B. Work that scales with the batch
  (compute-bound) nearly doubles it; fixed per-step costs (Python, dispatch, launches) do not;
- GPU utilisation sampled through NVML while the run at B goes on, where a GPU exists;
- a profiler trace of the last steps of the run at B (torch.profiler / jax.profiler) and its top ops.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.config import RunConfig, add_config_arguments, config_from_args
from common.results import atomic_write_text

# The loader stalls the device for at least a quarter of every step: faster compute would not help.
INPUT_BOUND_WAIT = 0.25
# Doubling the batch multiplies compute time by at least this much: the device is busy with the work itself.
# Pure compute gives x2 and pure per-step overhead x1; CPU kernels also get somewhat more efficient with the
# batch, so compute-bound runs measured here give x1.6-1.8 and overhead-bound ones x1.0-1.2.
COMPUTE_BOUND_RATIO = 1.4
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
            import pynvml

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


def _run(framework: str, config: RunConfig, timeout_s: float | None) -> dict[str, Any]:
    from experiments.paired import run_framework

    result = run_framework(framework, config, timeout_s)
    if result.get("status") != "ok":
        raise RuntimeError(f"{framework} run at batch {config.batch_size} {result.get('status')}: {result.get('error', '')}")
    return result


def diagnose(framework: str, config: RunConfig, out: Path, profile_steps: int = 3,
             timeout_s: float | None = None) -> Diagnosis:
    from experiments.paired import paired_config

    # Torch's initial weights for both frameworks: the same starting point, and Flax's own jitted init
    # would cost a 6 s compilation (XLA:CPU, its random initializers) in every run.
    config = paired_config(config, out / "weights")
    traced = config.replace(profile_steps=profile_steps, profile_dir=str(out / framework / "profile"),
                            steps=(config.steps or 0) + profile_steps)
    with GpuSampler() as sampler:
        at_b = _run(framework, traced, timeout_s)
    at_2b = _run(framework, config.replace(batch_size=2 * config.batch_size), timeout_s)
    timing_b, timing_2b = at_b["timing"], at_2b["timing"]
    wait = float(timing_b["data_wait_fraction"])
    compute_b, compute_2b = timing_b["compute_s"]["median"], timing_2b["compute_s"]["median"]
    ratio = compute_2b / compute_b
    gpu = sampler.summary()
    verdict = classify(wait, ratio, gpu["median"] if gpu else None)
    evidence = [
        f"data wait: {100 * wait:.1f}% of each steady-state step (input-bound from {100 * INPUT_BOUND_WAIT:.0f}%)",
        f"batch doubling: compute {compute_b * 1e3:.1f} ms at B={config.batch_size} -> {compute_2b * 1e3:.1f} ms at "
        f"2B, x{ratio:.2f} (x2 = all work scales with the batch: compute-bound from x{COMPUTE_BOUND_RATIO}; "
        f"x1 = fixed per-step costs: overhead-bound)",
        f"GPU utilisation (NVML, whole run): median {gpu['median']:.0f}%, p90 {gpu['p90']:.0f}%" if gpu
        else (sampler.unavailable or "GPU utilisation: no samples"),
    ]
    profile = at_b.get("profile")
    if profile and profile.get("top_ops"):
        top = ", ".join(f"{op['name']} {op['ms']:.1f} ms" for op in profile["top_ops"][:3])
        evidence.append(f"profiler ({profile['tool']}, {profile['steps']} steps, by {profile['ranked_by']}): {top}; "
                        f"trace {profile['trace']}")
    return Diagnosis(framework=framework, verdict=verdict, evidence=evidence, data_wait_fraction=wait,
                     step_ms=timing_b["step_s"]["median"] * 1e3, compute_ms_at_b=compute_b * 1e3,
                     compute_ms_at_2b=compute_2b * 1e3, doubling_ratio=ratio, batch_size=config.batch_size,
                     gpu_utilisation=gpu, profile=profile, runs={"device": str(at_b.get("device"))})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    parser.add_argument("--out", default="results/diagnose")
    parser.add_argument("--timeout", type=float, default=1800.0)
    add_config_arguments(parser)


def diagnosis_config(config: RunConfig) -> RunConfig:
    """A short run of ``config``: 12 steps unless given, one evaluation batch (accuracy is not the point)."""
    from experiments.defaults import with_default_data

    config = with_default_data(config)
    if config.steps is None:
        config = config.replace(steps=12, epochs=None)
    return config.replace(eval_batches=1, profile_steps=0, profile_dir=None)  # diagnose() adds the traced steps


def run(args: argparse.Namespace) -> int:
    import json

    from experiments.paired import FRAMEWORKS
    from experiments.plan import console_for_output

    config = diagnosis_config(config_from_args(args))
    out = Path(args.out)
    console = console_for_output()
    results = []
    for framework in FRAMEWORKS if args.framework == "both" else (args.framework,):
        console.print(f"[bold]diagnose[/] {framework}: runs at batch {config.batch_size} (traced) and {2 * config.batch_size} ...")
        found = diagnose(framework, config, out, args.profile_steps or 3, args.timeout)
        results.append(found)
        console.print(f"[bold]{framework}: {found.verdict}[/]")
        for line in found.evidence:
            console.print(f"  - {line}")
    atomic_write_text(out / "diagnosis.json", json.dumps({"config": config.to_dict(), "diagnoses": [asdict(d) for d in results]},
                                                         indent=1, default=str))
    console.print(f"written: {out / 'diagnosis.json'}")
    return 0
