"""Inference variants: conv+BN folding equals the unfolded model (both frameworks); the ONNX export equals
torch; INT8 stays within a stated accuracy delta of fp32 on a model trained for a few epochs; the infer
command reports sane latencies; a missing optional runtime is a clear skip."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import built_once

from common.config import RunConfig
from common.workloads import arch
from experiments.__main__ import main

INT8_ACCURACY_DELTA = 0.05  # the stated bound: at most 5 points of eval accuracy lost to INT8


@pytest.fixture(scope="session")
def trained(cifar10_archive, tmp_path_factory):
    """A small ResNet trained for 4 epochs on the CIFAR-10 fixture by the torch trainer: (config, weights)."""
    from torch_impl.backend import fit

    config = RunConfig(source="cifar10", data=str(cifar10_archive), model="resnet10", width=0.25, batch_size=32,
                       epochs=4, lr=0.05, warmup_steps=5)

    def train(folder: Path) -> None:
        result = fit(config.replace(save_weights=str(folder / "weights.npz")))
        assert result.status == "ok", result.error

    return config, str(built_once(tmp_path_factory, "inference-trained", train) / "weights.npz")


def _images(config: RunConfig, count: int) -> np.ndarray:
    from experiments.execution.inference import eval_batches

    return eval_batches(config, count, 1)[0][0]


def _max_relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.slow
def test_torch_folding_equals_the_unfolded_model(trained):
    import torch

    from torch_impl.inference import fold_batchnorm, load_model

    config, weights = trained
    model = load_model(config, arch(config, 10), weights).cpu()
    folded = fold_batchnorm(model)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    images = torch.from_numpy(_images(config, 16).transpose(0, 3, 1, 2).copy())
    with torch.inference_mode():
        assert _max_relative(folded(images).numpy(), model(images).numpy()) < 1e-5


def test_jax_folding_equals_the_unfolded_model(trained):
    import jax

    from jax_impl.inference import fold_batchnorm, load_model

    config, weights = trained
    model, variables = load_model(config, arch(config, 10), weights)
    folded, folded_variables = fold_batchnorm((model, variables))
    params = folded_variables["params"]
    assert "scale" not in params["layer1_0"]["bn1"] and "bias" in params["layer1_0"]["bn1"]
    images = _images(config, 16)
    expected = np.asarray(jax.jit(lambda x: model.apply(variables, x))(images))
    got = np.asarray(jax.jit(lambda x: folded.apply({"params": params}, x))(images))
    assert _max_relative(got, expected) < 1e-5


def test_the_onnx_export_equals_torch(trained, tmp_path):
    import onnxruntime as ort
    import torch

    from torch_impl.inference import _export_onnx as export_onnx
    from torch_impl.inference import load_model

    config, weights = trained
    model = load_model(config, arch(config, 10), weights).cpu()
    session = ort.InferenceSession(str(export_onnx(model, tmp_path / "m.onnx", 32)), providers=["CPUExecutionProvider"])
    images = _images(config, 8).transpose(0, 3, 1, 2).copy()
    with torch.inference_mode():
        expected = model(torch.from_numpy(images)).numpy()
    assert _max_relative(session.run(["logits"], {"images": images})[0], expected) < 1e-4


@pytest.mark.slow
@pytest.mark.e2e
def test_infer_reports_latency_accuracy_and_skips(trained, tmp_path, monkeypatch, capsys):
    config, weights = trained
    args = ["infer", "--source", "cifar10", "--data", config.data, "--model", "resnet10", "--width", "0.25",
            "--weights", weights, "--warmup", "2", "--throughput-batches", "32", "--throughput-calls", "2",
            "--calibration-batches", "4", "--out", str(tmp_path)]
    code = main([*args, "--variants", "eager", "folded", "int8", "int8-static", "onnxruntime", "tensorrt", "--calls",
                 "20"])
    assert code == 0
    rows = {(r["framework"], r["variant"]): r for r in map(json.loads,
                                                           (tmp_path / "runs.jsonl").read_text().splitlines())
            if r.get("command") == "infer"}
    assert len(rows) == 12
    for variant in {v for _, v in rows}:  # one name, one method: every row says the same in both frameworks
        assert rows[("torch", variant)]["method"] == rows[("jax", variant)]["method"], variant
        if rows[("torch", variant)]["status"] == rows[("jax", variant)]["status"] == "ok":
            assert set(rows[("torch", variant)]) == set(rows[("jax", variant)]), variant
    for framework in ("torch", "jax"):
        eager = rows[(framework, "eager")]
        assert eager["accuracy"] > 0.3  # trained: far above the 0.1 of chance
        for variant in ("eager", "folded", "int8"):
            row = rows[(framework, variant)]
            assert row["status"] == "ok", row
            assert 0 < row["latency_b1_ms"]["p50"] <= row["latency_b1_ms"]["p99"]
            assert row["throughput"]["32"]["images_per_s"] > 0
        assert rows[(framework, "folded")]["accuracy"] == pytest.approx(eager["accuracy"], abs=0.011)
        assert abs(rows[(framework, "int8")]["accuracy_delta"]) <= INT8_ACCURACY_DELTA
        assert rows[(framework, "tensorrt")]["status"] == "skipped" and rows[(framework, "tensorrt")]["note"]
    assert abs(rows[("torch", "int8-static")]["accuracy_delta"]) <= INT8_ACCURACY_DELTA  # torch.ao's x86 kernels
    assert rows[("jax", "int8-static")]["status"] == "skipped" and "no static" in rows[("jax", "int8-static")]["note"]
    assert rows[("torch", "onnxruntime")]["status"] == "ok"
    assert rows[("torch", "onnxruntime")]["accuracy"] == pytest.approx(rows[("torch", "eager")]["accuracy"], abs=0.011)
    assert rows[("jax", "onnxruntime")]["status"] == "skipped"
    report = (tmp_path / "report.md").read_text()
    assert "| torch | int8 | ok |" in report and "skipped" in report
    assert (tmp_path / "inference_latency.png").read_bytes()[:4] == b"\x89PNG"
    _rerun_keeps_the_measured_rows(args, tmp_path, monkeypatch, capsys)


def _rerun_keeps_the_measured_rows(args, folder, monkeypatch, capsys):
    """Issue 13: a rerun with other settings is refused, naming them. Issue 26: a rerun with the same settings
    resumes per variant: the finished ones are kept, not measured again."""
    from experiments.commands import infer
    from experiments.execution.store import ResultStore

    before = ResultStore(folder).rows()
    capsys.readouterr()
    assert main([*args, "--variants", "eager", "--calls", "30"]) == 2
    assert "options.calls: 20 -> 30" in capsys.readouterr().err

    def measured_again(*args: object, **kwargs: object) -> list:
        raise AssertionError("a finished variant was measured again")

    monkeypatch.setattr(infer, "infer_rows", measured_again)
    assert main([*args, "--variants", "eager", "--calls", "20"]) == 0
    assert "kept 2 variant(s) measured earlier with the same settings" in capsys.readouterr().out
    assert ResultStore(folder).rows() == before


def test_a_missing_optional_runtime_is_a_clear_skip(trained, monkeypatch):
    from experiments.execution.inference import measure_variant

    config, weights = trained
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now fails
    row = measure_variant("torch", "onnxruntime", config, weights, {"eval_batches": 1, "calibration_batches": 1})
    assert row["status"] == "skipped" and "onnxruntime is not installed" in row["note"]
