"""The ladder answers its user's question (issue 14): the mixed-precision rung runs one dtype in both frameworks on
every device, a dtype the hardware emulates is flagged with its measured cost, every technique has its "top minus
X" ablation, and the recommendation is the fastest measured configuration with a command that rebuilds it."""

from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from common.config import RunConfig
from common.results import RunResult, Summary, Timing
from experiments.__main__ import main
from experiments.catalog.rungs import DEFAULT_ORDER, Device, ladder_rungs, parse_order, rung_config
from experiments.cli import add_config_arguments, config_from_args
from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.host import Capabilities, detect, emulation, host_info
from experiments.execution.plan import LadderOptions, Prepared, ladder_plan
from experiments.execution.record import RunRecord
from experiments.execution.store import ResultStore
from experiments.reporting.analysis import analyse, ladder_pairs, recommend
from experiments.reporting.cells import ladder_cells
from experiments.reporting.recommend import NOT_REPRODUCED, Answer
from experiments.reporting.report import write_report
from experiments.reporting.tables import precision_cell

NO_BF16 = {"cpu_flags": ["avx2", "fma"], "gpu_capability": None, "simulated": True}
BF16 = {"cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "gpu_capability": None, "simulated": True}


def _plan(tmp_path: Path, cuda: bool = False, order: tuple[str, ...] = DEFAULT_ORDER, ablations: bool = True):
    base = RunConfig(steps=3, epochs=None, width=0.125, batch_size=16)
    prepared = Prepared(base, tmp_path, ResultStore(tmp_path), FRAMEWORKS)
    return ladder_plan(prepared, 1, "tiny", LadderOptions(Device(cuda, 2), order, ablations))


@pytest.mark.parametrize("cuda, dtype", [(False, "bf16"), (True, "fp16")])
def test_the_mixed_precision_rung_runs_one_dtype_in_both_frameworks(tmp_path, cuda, dtype):
    jobs = {(job.fields["rung"], job.framework): job.config for job in _plan(tmp_path, cuda)}
    for rung in ("amp", "compile", "minus-loader", "minus-flags"):
        assert jobs[(rung, "torch")].precision == jobs[(rung, "jax")].precision == dtype
    assert jobs[("minus-amp", "torch")].precision == jobs[("minus-amp", "jax")].precision == "fp32"
    # the two frameworks run the same config in every rung, so a difference is the frameworks'
    assert all(jobs[(rung, "torch")].replace(tensorboard_dir=None) == jobs[(rung, "jax")].replace(tensorboard_dir=None)
               for rung, _ in jobs)


def test_every_technique_has_its_ablation_and_the_order_can_change(tmp_path):
    rungs = ladder_rungs()
    assert [r.name for r in rungs] == ["baseline", "loader", "flags", "amp", "compile", "minus-loader", "minus-flags",
                                       "minus-amp"]
    top = RunConfig(steps=3, epochs=None)
    device = Device(False, 4)
    by_name = {r.name: rung_config(r, top, device) for r in rungs}
    # top minus the last technique is the rung below the top: not measured twice
    assert all(by_name[f"minus-{t}"] != by_name["compile"] for t in DEFAULT_ORDER[:-1])
    assert by_name["minus-amp"] == by_name["compile"].replace(precision="fp32")
    assert by_name["minus-flags"] == by_name["compile"].replace(cudnn_benchmark=False, matmul_precision="highest")
    assert by_name["minus-loader"].workers == 2 and not by_name["minus-loader"].pin_mem
    assert by_name["minus-loader"].compile == "compiled"

    order = parse_order("compile,loader,flags,amp")  # how a JAX user starts
    jobs = {job.fields["rung"]: job for job in _plan(tmp_path, order=order) if job.framework == "jax"}
    assert jobs["compile"].config.compile == "compiled" and jobs["compile"].config.workers == 2
    assert jobs["compile"].fields["techniques"] == ["compile"]
    assert set(jobs) == {"baseline", *order, "minus-compile", "minus-loader", "minus-flags"}
    assert jobs["minus-compile"].config.compile == "eager" and jobs["minus-compile"].config.precision == "bf16"
    assert {job.fields["rung"] for job in _plan(tmp_path, ablations=False)} == {"baseline", *DEFAULT_ORDER}
    with pytest.raises(Exception, match="unknown technique"):
        parse_order("compile,fp8")


def test_each_rung_and_framework_has_its_compile_cache_cold_at_its_first_use(tmp_path):
    base = RunConfig(steps=3, epochs=None)
    plan = ladder_plan(Prepared(base, tmp_path, ResultStore(tmp_path), FRAMEWORKS), 2, "tiny",
                       LadderOptions(Device(False, 2)))
    caches = {}
    for job in plan:
        caches.setdefault((job.fields["rung"], job.framework), set()).add(job.cache)
        assert job.fields["cache"].startswith("cold" if job.cold else "warm")
        # the first run of a cache (in the seeded order) compiles cold: repeat 0 of a cumulative rung, or whichever
        # of the top rung, its A/A control and the ablations compiling its program comes first
        assert job.cold == (job is next(j for j in plan if j.cache == job.cache))
        assert job.cold <= (job.fields["repeat"] == 0)
    assert all(len(folders) == 1 for folders in caches.values())  # repeats share their rung's cache
    for framework in FRAMEWORKS:
        # the loader changes no program: top minus loader reads the top rung's cache; the loader rung, a cumulative
        # one, compiles cold in repeat 0 as every other cumulative rung does
        assert caches[("loader", framework)] != caches[("baseline", framework)]
        assert caches[("minus-loader", framework)] == caches[("compile", framework)]
        assert caches[("minus-amp", framework)] != caches[("compile", framework)]  # fp32: another program
        # the fp32 matmul precision: in JAX's program (each dot's) and in inductor's cache key
        assert caches[("minus-flags", framework)] != caches[("compile", framework)]
    cumulative = [next(iter(f)) for (rung, _), f in caches.items() if rung in ("baseline", *DEFAULT_ORDER)]
    assert len(set(cumulative)) == len(cumulative)


def test_a_cpu_without_native_bf16_gets_the_emulated_flag(monkeypatch):
    monkeypatch.setenv("TWINRUN_CPU_FLAGS", "avx2,fma")
    monkeypatch.delenv("TWINRUN_GPU_CAPABILITY", raising=False)
    caps = detect()
    assert caps.simulated and not caps.cpu_bf16
    assert "emulated" in emulation("bf16", on_gpu=False, caps=caps)
    assert emulation("fp32", on_gpu=False, caps=caps) is None
    monkeypatch.setenv("TWINRUN_CPU_FLAGS", "avx2,avx512_bf16")
    assert emulation("bf16", on_gpu=False, caps=detect()) is None
    assert "fp16 emulated" in emulation("fp16", on_gpu=False, caps=detect())  # no avx512_fp16
    monkeypatch.setenv("TWINRUN_GPU_CAPABILITY", "7.0")  # a V100: fp16 tensor cores, no bf16
    caps = detect()
    assert emulation("fp16", on_gpu=True, caps=caps) is None and "emulated" in emulation("bf16", True, caps)
    assert Capabilities.from_dict(caps.to_dict()) == caps


def _record(job, step_ms: float, capabilities: dict, device: str = "cpu") -> RunRecord:
    step = Summary(step_ms / 1e3, step_ms / 1e3, step_ms / 1e3, step_ms / 1e3, step_ms / 1e3, step_ms / 1e3, 3)
    result = RunResult(job.framework, "ok", steps_done=3, losses=[4.6, 4.5, 4.4], device=device,
                       timing=Timing(timed_steps=3, first_step_s=2.0, warmup_steps=1, step_s=step))
    host = {**host_info(), "capabilities": capabilities}
    return RunRecord(key=job.key, command="ladder", result=result, config=job.config.to_dict(), host=host,
                     fields=dict(job.fields))


# planted median step times (ms): fp32 eager 100, bf16 costs 4x (emulated) or 0.8x (native), compile halves
def _step_ms(config: RunConfig, bf16_factor: float) -> float:
    ms = 100.0 * (bf16_factor if config.precision == "bf16" else 1.0)
    return ms / 2 if config.compile == "compiled" else ms


def _records(tmp_path: Path, factor: float, capabilities: dict, repeats: int = 3) -> list[RunRecord]:
    """Planted rows of ``repeats`` repeats, each run 2% off its configuration's time (seeded)."""
    rng = np.random.default_rng(14)
    plan = ladder_plan(Prepared(RunConfig(steps=3, epochs=None, width=0.125, batch_size=16), tmp_path,
                                ResultStore(tmp_path), FRAMEWORKS), repeats, "tiny", LadderOptions(Device(False, 2)))
    return [_record(job, _step_ms(job.config, factor) * math.exp(rng.normal(0, 0.02)), capabilities) for job in plan]


# NO_BF16: fp32 compiled (top minus amp) is alone the fastest; BF16: compile, top - loader and top - flags tie at
# 40 ms, and the two ablations have one technique fewer than the top rung
@pytest.mark.parametrize("capabilities, factor, best", [(NO_BF16, 4.0, {"minus-amp"}),
                                                        (BF16, 0.8, {"minus-loader", "minus-flags"})])
def test_the_recommendation_is_the_simplest_of_the_fastest_and_its_command_rebuilds_it(tmp_path, capabilities,
                                                                                         factor, best):
    records = _records(tmp_path, factor, capabilities)
    cells = ladder_cells(records)
    analysis = analyse(cells, ladder_pairs(cells, DEFAULT_ORDER))
    for framework in FRAMEWORKS:
        rec = recommend(analysis, cells, framework)
        assert rec is not None and rec.chosen in best and rec.supported
        answer = Answer(rec, cells, analysis.estimates)
        assert f"twinrun run --framework {framework}" in answer.line() and "faster by " in answer.line()
        # the command, parsed by `twinrun run`'s own parser, is the recommended config
        parser = argparse.ArgumentParser()
        add_config_arguments(parser)
        words = shlex.split(answer.command)
        assert words[:4] == ["twinrun", "run", "--framework", framework]
        rebuilt = config_from_args(parser.parse_args(words[4:]))
        expected = RunConfig.from_dict(cells[(rec.chosen, framework)].example.config)
        assert rebuilt == replace(expected, **{name: None for name in NOT_REPRODUCED if name != "profile_dir"})
    emulated = precision_cell(cells, "amp", "torch", analysis)
    if capabilities is NO_BF16:  # the cost is measured: 4x the fp32 rung below
        assert emulated.startswith("bf16 (emulated here: +3") and "% vs fp32)" in emulated
        assert 280 <= int(emulated.split("+")[1].split("%")[0]) <= 320
    else:
        assert emulated == "bf16"


def test_the_report_names_the_capabilities_ablations_and_recommendation(tmp_path):
    store = ResultStore(tmp_path)
    for record in _records(tmp_path, 4.0, NO_BF16):
        store.add(record.to_row())
    report = write_report(tmp_path)
    text = report.path.read_text()
    assert "native bf16 no" in text and "[simulated by override]" in text
    assert "## Ablations" in text and "| minus-amp | torch |" in text and "| minus-loader | jax |" in text
    assert "## Recommendation" in text and "top - amp" in text
    assert "bf16 emulated on this device (CPU without avx512_bf16 or amx_bf16): against the same techniques in fp32, " \
           "slower by 30" in text
    assert any("recommended: top - amp" in line for line in report.summary)


def test_bad_ladder_orders_are_refused_by_name(tmp_path, capsys):
    assert main(["ladder", "--rungs", "compile,fp8", "--results", str(tmp_path)]) == 2
    assert "unknown technique(s) fp8" in capsys.readouterr().err
    assert main(["ladder", "--rungs", "amp,amp", "--results", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal: 60 is not an accuracy
        main(["ladder", "--to-accuracy", "60", "--results", str(tmp_path)])
    assert exit_.value.code == 2 and "must be in (0, 1]" in capsys.readouterr().err
