"""Runs one measured job in its own interpreter: clean compile caches and memory peak, and a crash or
out-of-memory marks only that job failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def run_isolated(task: str, payload: dict[str, Any], timeout_s: float | None = None,
                 env: dict[str, str] | None = None, processes: int = 1) -> dict[str, Any]:
    """Runs ``experiments.worker`` for ``task`` in a subprocess (``processes`` > 1: that many, started by
    torchrun, rank 0 answering); returns its result, or a failed result carrying the end of its error output."""
    with tempfile.TemporaryDirectory(prefix="twinrun-") as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, "-m", "experiments.worker", task, json.dumps(payload), str(out)]
        if processes > 1:  # torchrun's own launcher; --standalone picks a free local rendezvous
            command[1:2] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", "-m"]
        # A compile cache of its own: inductor's on-disk cache would otherwise turn a later run's
        # "first step" into a cache hit (1.9 s instead of 20 s seen here), not a compilation.
        run_env = {**(env if env is not None else os.environ), "TORCHINDUCTOR_CACHE_DIR": str(Path(folder) / "inductor")}
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=run_env)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "error": f"timed out after {timeout_s} s"}
        if out.exists():
            return json.loads(out.read_text())
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-15:]
        reason = "killed (out of memory?)" if proc.returncode in (-9, 137) else f"exit code {proc.returncode}"
        return {"status": "failed", "error": f"{reason}: " + "\n".join(tail)}
