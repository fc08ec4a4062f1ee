"""Text inference (``twinrun infer --model text-*``): the ONNX export (dynamic batch and sequence axes, the padding
mask inside the graph) equals torch at two sequence lengths; INT8 stays within a stated accuracy delta of fp32 on a
text-micro trained a few epochs, in both frameworks; INT4 is a row or a skip that names the library and its pip
command; a missing runtime or no GPU is a clear skip; the command times batch 1 over different eval texts, warms up
every padded shape first and says how many programs it compiled.

text-micro (max_len 64, mean pooling) on a 300/100-text AG News-layout fixture: the model learns to ~0.48 in 2 s.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from common.config import RunConfig
from common.data.text import bucket_sizes
from common.workloads import arch
from experiments.__main__ import main
from experiments.execution.inference import EvalInputs

INT8_ACCURACY_DELTA = 0.05  # the stated bound: at most 5 points of eval accuracy lost to INT8
INT4_ACCURACY_DELTA = 0.10  # weight-only int4 (group 32) loses more than int8: at most 10 points
ONNX_TOLERANCE = 1e-4  # onnxruntime's logits against torch's, absolute
FRAMEWORKS = ("torch", "jax")
INT4_LIBRARIES = {"torch": ("torchao", "pip install torchao=="), "jax": ("qwix", "pip install qwix==")}
SMALL = {"calls": 6, "warmup": 1, "throughput_batches": [8], "throughput_calls": 1, "calibration_batches": 1,
         "eval_batches": 1}


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> Path:
    from experiments.catalog.fixtures import write_text_fixture

    return write_text_fixture(tmp_path_factory.mktemp("agnews-infer"), fmt="agnews", n_train=300, n_test=100, seed=3)


@pytest.fixture(scope="session")
def trained(data, tmp_path_factory) -> tuple[RunConfig, str]:
    """text-micro trained 8 epochs (152 AdamW steps) by the torch trainer in this process: (config, weights)."""
    import torch

    from torch_impl.backend import fit

    weights = tmp_path_factory.mktemp("text-trained") / "weights.npz"
    config = RunConfig(model="text-micro", source="text", data=str(data), max_len=64, pool="mean", batch_size=16,
                       epochs=8, optimizer="adamw", lr=3e-3, weight_decay=0.01, warmup_steps=3,
                       save_weights=str(weights))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on 2 cores shared with other processes, 2 threads thrash: 40 s instead of 2 s here
    try:
        result = fit(config)
    finally:
        torch.set_num_threads(threads)
    assert result.ok, result.error
    assert result.eval.accuracy > 0.35  # type: ignore[union-attr]  # trained: well above the 0.25 of chance
    return config.replace(save_weights=None), str(weights)


def _accuracy(predict, batches) -> float:
    correct = sum(int((predict(tokens).argmax(1) == labels).sum()) for tokens, labels in batches)
    return correct / sum(len(labels) for _, labels in batches)


def test_the_onnx_export_takes_any_length_and_equals_torch(trained, tmp_path):
    import onnx
    import onnxruntime as ort
    import torch

    from torch_impl.inference import _export_text_onnx as export_text_onnx
    from torch_impl.inference import load_model

    config, weights = trained
    description = arch(config, 4)
    model = load_model(config, description, weights).cpu()
    path = export_text_onnx(model, tmp_path / "text.onnx", description.max_len)
    graph = onnx.load(str(path)).graph
    (tokens,) = graph.input
    assert [d.dim_param for d in tokens.type.tensor_type.shape.dim] == ["batch", "sequence"]
    assert tokens.type.tensor_type.elem_type == onnx.TensorProto.INT32
    assert "Equal" in {node.op_type for node in graph.node}  # tokens != PAD: the mask is built inside the graph
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = EvalInputs(config)  # pad-longest: a text alone at its own length, a batch at its longest text's
    singles = inputs.singles(10)
    short = min(singles, key=lambda x: x.shape[1])
    batches = [short, max(singles, key=lambda x: x.shape[1]), inputs.first(4)[0]]
    assert len({batch.shape[1] for batch in batches[:2]}) == 2
    for batch in [*batches, short[:, :5]]:  # and a text cut to 5 tokens
        with torch.inference_mode():
            expected = model(torch.from_numpy(batch)).numpy()
        got = session.run(["logits"], {"tokens": batch})[0]
        assert np.abs(got - expected).max() < ONNX_TOLERANCE, batch.shape


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_int8_stays_within_the_stated_accuracy_delta(trained, framework):
    """Weight-only and dynamic INT8 (common/inference.py) against fp32 (JAX: jit, the same function as op by op
    without compiling every primitive per shape) on a trained encoder. pad-max: one shape."""
    from experiments.execution.frameworks import module

    config, weights = trained
    config = config.replace(batching="pad-max")
    inference = module(framework, "inference")
    description = arch(config, 4)
    batches = EvalInputs(config).batches(128, None)
    fp32, _ = inference.build("eager" if framework == "torch" else "compiled", config, description, weights, [])
    reference = _accuracy(fp32, batches)
    assert reference > 0.35
    for variant in ("int8", "int8-dynamic"):
        int8, note = inference.build(variant, config, description, weights, [])
        assert abs(_accuracy(int8, batches) - reference) <= INT8_ACCURACY_DELTA, (variant, note)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_int4_is_a_clean_row_or_a_skip_that_names_the_library(trained, framework, monkeypatch):
    from experiments.execution.inference import measure_variant

    config, weights = trained
    package, pip = INT4_LIBRARIES[framework]
    row = measure_variant(framework, "int4", config, weights, SMALL)
    if importlib.util.find_spec(package) is None:  # the 'test' extra installs both: CI takes the other branch
        assert row["status"] == "skipped" and package in row["note"] and pip in row["note"], row
    else:
        reference = measure_variant(framework, "eager" if framework == "torch" else "compiled", config, weights, SMALL)
        assert row["status"] == "ok" and package in row["note"] and "INT4 weight-only" in row["note"], row
        assert abs(row["accuracy"] - reference["accuracy"]) <= INT4_ACCURACY_DELTA, (row, reference)
    for name in [name for name in sys.modules if name.split(".")[0] == package] or [package]:
        monkeypatch.setitem(sys.modules, name, None)  # the library missing: importing it (or any part) now fails
    row = measure_variant(framework, "int4", config, weights, SMALL)
    assert row["status"] == "skipped" and f"{package} is not installed" in row["note"] and pip in row["note"]


def test_a_missing_runtime_or_no_gpu_is_a_clear_skip(trained, monkeypatch):
    import torch

    from experiments.execution.inference import measure_variant

    config, weights = trained
    if not torch.cuda.is_available():
        row = measure_variant("torch", "tensorrt", config, weights, SMALL)
        assert row["status"] == "skipped" and "needs a CUDA GPU" in row["note"]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    row = measure_variant("torch", "onnxruntime", config, weights, SMALL)
    assert row["status"] == "skipped" and "onnxruntime is not installed" in row["note"]


@pytest.mark.slow  # a program per padded length: 10.4 s of `make test-fast` here
def test_jit_compiles_a_program_per_padded_length_in_the_warm_up_and_buckets_bound_them(trained):
    """JAX's compiled variant at batch 1: pad-longest compiles one program per distinct text length, bucket one per
    bucket; all of it in the warm-up, before the timed calls, and the note says how many."""
    from experiments.execution.inference import measure_variant

    config, weights = trained
    rows = {batching: measure_variant("jax", "compiled", config.replace(batching=batching), weights, SMALL)
            for batching in ("pad-longest", "bucket")}
    for row in rows.values():
        assert row["status"] == "ok", row
        assert row["compiled_in_warmup"] == {"graphs": row["b1_shapes"], "recompile-limit hits": 0}  # torch's fields
        assert f"compiled in the warm-up: {row['b1_shapes']} graphs" in row["note"]
    longest, bucket = rows["pad-longest"], rows["bucket"]
    assert longest["b1_shapes"] == len(set(EvalInputs(config).real_lengths(SMALL["calls"]))) > bucket["b1_shapes"]


@pytest.mark.slow
@pytest.mark.e2e
def test_infer_times_different_texts_padded_per_the_batching(trained, tmp_path, monkeypatch):
    """The command over both frameworks (torch.compile's 15 s of inductor compilation is left to the trainer tests
    and the jit test above: the shape counting is the same code)."""
    config, weights = trained
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the isolated runs: 2 threads on 2 shared cores thrash (see above)
    calls = 12
    code = main(["infer", "--model", "text-micro", "--data", str(config.data), "--max-len", "64", "--pool", "mean",
                 "--batching", "bucket", "--weights", weights, "--variants", "eager", "int8", "int4", "onnxruntime",
                 "tensorrt", "--calls", str(calls), "--warmup", "1", "--throughput-batches", "32",
                 "--throughput-calls", "2", "--out", str(tmp_path)])
    assert code == 0
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    rows = {(r["framework"], r["variant"]): r for r in map(json.loads, lines) if r.get("command") == "infer"}
    assert len(rows) == 10
    for framework in FRAMEWORKS:
        eager = rows[(framework, "eager")]
        buckets = bucket_sizes(eager["b1_lengths"]["real_max"], "pow2")  # the eval maker's: up to its longest text
        for variant in ("eager", "int8"):
            row = rows[(framework, variant)]
            assert row["status"] == "ok", row
            assert 0 < row["latency_b1_ms"]["p50"] <= row["latency_b1_ms"]["p99"]
            lengths = row["b1_lengths"]
            assert lengths["examples"] == calls and lengths["real_min"] < lengths["real_max"]  # different texts
            assert 2 <= row["b1_shapes"] <= len(buckets)  # bucket: a few shapes, not one per length
            assert row["throughput"]["32"]["padded_length"] in buckets and row["throughput"]["32"]["images_per_s"] > 0
            assert f"padded bucket to {row['b1_shapes']} shape(s)" in row["note"]
        assert abs(rows[(framework, "int8")]["accuracy_delta"]) <= INT8_ACCURACY_DELTA
        assert rows[(framework, "int4")]["status"] in ("ok", "skipped") and rows[(framework, "int4")]["note"]
        assert rows[(framework, "tensorrt")]["status"] == "skipped" and rows[(framework, "tensorrt")]["note"]
    assert rows[("jax", "int8")]["compiled_in_warmup"]["graphs"] == rows[("jax", "int8")]["b1_shapes"]
    assert rows[("torch", "onnxruntime")]["status"] == "ok"
    assert rows[("torch", "onnxruntime")]["accuracy"] == pytest.approx(rows[("torch", "eager")]["accuracy"], abs=0.011)
    assert rows[("jax", "onnxruntime")]["status"] == "skipped"
    report = (tmp_path / "report.md").read_text()
    assert "| torch | int8 | ok |" in report
    assert "| texts/s @32 [95% CI] |" in report  # a text model's throughput counts texts
