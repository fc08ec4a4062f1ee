"""Measurements of the device itself: whether CUDA is there, and its fp32 matmul rate (the MFU denominator),
measured once per results folder in a torch-only process and stored as the folder's "device/matmul-rate" row."""

from __future__ import annotations

import statistics
import time
from typing import Any

from experiments.catalog.rows import MATMUL_RATE_COMMAND, MATMUL_RATE_KEY
from experiments.execution.runner import run_isolated
from experiments.execution.store import ResultStore


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def measure_matmul_rate() -> dict[str, Any]:
    """In this process: the median rate of fp32 ('highest') n x n matmuls, synchronized, after 2 warm-up calls."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n = 4096 if device.type == "cuda" else 1024
    torch.set_float32_matmul_precision("highest")
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    times = []
    for _ in range(7):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    best = statistics.median(times[2:])
    return {"status": "ok", "flops_per_s": 2 * n**3 / best, "n": n, "device": str(device)}


def has_matmul_rate(store: ResultStore) -> bool:
    return any(row.get("key") == MATMUL_RATE_KEY and row.get("status") == "ok" for row in store.rows())


def ensure_matmul_rate(store: ResultStore, timeout_s: float | None = None) -> None:
    """Measures the device's matmul rate in its own process and stores its row, unless the folder has one; a
    failed measurement is stored as failed (the report then says "not measured") and retried on the next plan. The
    process is forked from the torch zygote (experiments/execution/zygote.py: torch imported, nothing run, as in a
    fresh interpreter; each ladder or sweep started one, ~4 s here, for 7 matmuls)."""
    if has_matmul_rate(store):
        return
    result = run_isolated("matmul-rate", {"framework": "torch"}, timeout_s=timeout_s)
    store.add({**{k: v for k, v in result.items() if k != "traceback"}, "key": MATMUL_RATE_KEY,
               "command": MATMUL_RATE_COMMAND})
