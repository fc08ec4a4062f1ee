"""Runs one measured job in its own interpreter: clean compile caches and memory peak, and a crash or
out-of-memory marks only that job failed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LAUNCHERS = ("torchrun", "jax.distributed")
# Names a torch inductor cache folder that every isolated run shares (tests only: it makes compile times cache hits).
SHARED_INDUCTOR_CACHE = "TWINRUN_SHARED_INDUCTOR_CACHE"
WORKER = "experiments.execution.worker"


def run_isolated(task: str, payload: dict[str, Any], timeout_s: float | None = None,
                 env: dict[str, str] | None = None, processes: int = 1, launcher: str = "torchrun") -> dict[str, Any]:
    """Runs ``experiments.execution.worker`` for ``task`` in a subprocess; returns its result, or a failed result
    carrying the end of its error output. ``processes`` > 1: that many, started by torchrun (which sets RANK and the
    rendezvous) or, for JAX, as local processes that join one jax.distributed coordinator; process 0 answers."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    with tempfile.TemporaryDirectory(prefix="twinrun-") as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, "-m", WORKER, task, json.dumps(payload), str(out)]
        # A compile cache of its own: inductor's on-disk cache would otherwise turn a later run's
        # "first step" into a cache hit (1.9 s instead of 20 s seen here), not a compilation. The test suite,
        # which reads no compile time, shares one instead (SHARED_INDUCTOR_CACHE, set in tests/conftest.py).
        base_env = env if env is not None else os.environ
        cache = base_env.get(SHARED_INDUCTOR_CACHE) or str(Path(folder) / "inductor")
        run_env = {**base_env, "TORCHINDUCTOR_CACHE_DIR": cache}
        # torchrun's own launcher; --standalone picks a free local rendezvous
        if processes > 1 and launcher == "torchrun":
            command[1:2] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", "-m"]
        if processes > 1 and launcher == "jax.distributed":
            coordinator = {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{_free_port()}"}
            envs = [{**run_env, **coordinator, "TWINRUN_PROCESS_ID": str(p)} for p in range(processes)]
        else:
            envs = [run_env]
        returncode, tail = _run_all(command, envs, timeout_s)
        if returncode == "timeout":
            return {"status": "failed", "error": f"timed out after {timeout_s} s"}
        if out.exists():
            return json.loads(out.read_text())
        reason = "killed (out of memory?)" if returncode in (-9, 137) else f"exit code {returncode}"
        return {"status": "failed", "error": f"{reason}: " + "\n".join(tail)}


def _run_all(command: list[str], envs: list[dict[str, str]], timeout_s: float | None) -> tuple[int | str, list[str]]:
    """Starts one process per environment and waits for all; the first to fail stops the others (they would
    wait for it in a collective until JAX's heartbeat timeout). Returns the worst exit code and its error tail."""
    with tempfile.TemporaryDirectory(prefix="twinrun-logs-") as logs:
        procs = []
        for index, env in enumerate(envs):
            log = open(Path(logs) / f"{index}.log", "w+")  # noqa: SIM115 -- closed below
            procs.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env), log))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        returncode: int | str = 0
        try:
            while any(proc.poll() is None for proc, _ in procs):
                failed = [proc.returncode for proc, _ in procs if proc.returncode not in (None, 0)]
                if failed or (deadline is not None and time.monotonic() > deadline):
                    returncode = failed[0] if failed else "timeout"
                    break
                time.sleep(0.05)
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        codes = [proc.returncode for proc, _ in procs]
        if returncode == 0:
            returncode = next((c for c in codes if c != 0), 0)
        worst = next((i for i, c in enumerate(codes) if c not in (0, -9)), 0)
        log = procs[worst][1]
        log.seek(0)
        tail = log.read().strip().splitlines()[-15:]
        for _, handle in procs:
            handle.close()
        return returncode, tail


def speaks_for_the_job(row: dict[str, Any]) -> bool:
    """Rank / process 0 writes the result of a run over several processes (torchrun or jax.distributed); a
    failure before the trainer knew its place is written by any process that has one to tell."""
    if "process_index" in row:
        return row["process_index"] == 0
    return os.environ.get("RANK", os.environ.get("TWINRUN_PROCESS_ID", "0")) == "0" or row.get("status") == "failed"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
