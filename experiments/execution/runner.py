"""Runs one measured job in its own interpreter: clean compile caches and memory peak, and a crash or
out-of-memory marks only that job failed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Any

from experiments.execution import reaper, zygote

LAUNCHERS = ("torchrun", "jax.distributed")
# Names a torch inductor cache folder that every isolated run shares (tests only: it makes compile times cache hits).
SHARED_INDUCTOR_CACHE = "TWINRUN_SHARED_INDUCTOR_CACHE"
# Names the folder of one run's compile caches (the ladder: one per rung and framework, empty for repeat 0):
# torch inductor's (FX graph and AOT autograd caches) and JAX's persistent compilation cache, every compilation.
COMPILE_CACHE = "TWINRUN_COMPILE_CACHE"
WORKER = "experiments.execution.worker"


def run_isolated(task: str, payload: dict[str, Any], timeout_s: float | None = None,
                 env: dict[str, str] | None = None, processes: int = 1, launcher: str = "torchrun") -> dict[str, Any]:
    """Runs ``experiments.execution.worker`` for ``task`` in a subprocess; returns its result, or a failed result
    carrying the end of its error output. ``processes`` > 1: that many, started by torchrun (which sets RANK and the
    rendezvous) or, for JAX, as local processes that join one jax.distributed coordinator; process 0 answers.
    Nothing of the job outlives this call, nor this process however it ends (experiments/execution/reaper.py)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    _remove_stale_folders_once()
    with _job_folder() as folder:
        out = folder / "result.json"
        command = [sys.executable, "-m", WORKER, task, json.dumps(payload), str(out)]
        # A compile cache of its own: inductor's on-disk cache would otherwise turn a later run's
        # "first step" into a cache hit (1.9 s instead of 20 s seen here), not a compilation. The test suite,
        # which reads no compile time, shares one instead (SHARED_INDUCTOR_CACHE, set in tests/conftest.py).
        base_env = env if env is not None else os.environ
        # the marker: every process of the job, wherever it goes (torchrun's own sessions), can be found and killed
        run_env = {**base_env, **_compile_cache_env(base_env, folder), reaper.MARKER: str(folder)}
        # torchrun's own launcher; --standalone picks a free local rendezvous
        if processes > 1 and launcher == "torchrun":
            command[1:2] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", "-m"]
        if processes > 1 and launcher == "jax.distributed":
            coordinator = {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{_free_port()}"}
            envs = [{**run_env, **coordinator, "TWINRUN_PROCESS_ID": str(p)} for p in range(processes)]
        else:
            envs = [run_env]
        forkable = processes == 1 and _forkable(task, payload)
        forks = zygote.zygote_for(payload["framework"], envs[0]) if forkable else None
        returncode, tail = _run_all(command, envs, timeout_s, folder, forks)
        if returncode == "timeout":
            return {"status": "failed", "error": f"timed out after {timeout_s} s"}
        if out.exists():
            return json.loads(out.read_text())
        reason = "killed (out of memory?)" if returncode in (-9, 137) else f"exit code {returncode}"
        return {"status": "failed", "error": f"{reason}: " + "\n".join(tail)}


def _forkable(task: str, payload: dict[str, Any]) -> bool:
    """Whether the job may be forked from its framework's zygote (experiments/execution/zygote.py): it names its
    framework, and its result holds no time counted from the process's start (time to accuracy, whole epochs: the
    imports are part of the wait a user has, so those start a fresh interpreter)."""
    config = payload.get("config") or {}
    counts_wall_time = config.get("epochs") is not None or config.get("target_accuracy") is not None
    return isinstance(payload.get("framework"), str) and not (task == "train" and counts_wall_time)


def _compile_cache_env(env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """The compile-cache variables of a job: the suite's shared caches, or the plan's per-run folder
    (COMPILE_CACHE), or the job's own empty folder (a cold compile, and nothing JAX keeps)."""
    planned = env.get(COMPILE_CACHE)
    own = Path(planned) if planned else folder
    values = {"TORCHINDUCTOR_CACHE_DIR": env.get(SHARED_INDUCTOR_CACHE) or str(own / "inductor")}
    if planned and "JAX_COMPILATION_CACHE_DIR" not in env:
        values.update(JAX_COMPILATION_CACHE_DIR=str(own / "jax"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return values


@contextmanager
def _job_folder() -> Iterator[Path]:
    """The job's temporary folder (result, logs, inductor cache): ``twinrun-<driver pid>-xxxxxxxx``, registered
    with the reaper before any process of the job starts, removed on every way out."""
    folder = tempfile.mkdtemp(prefix=reaper.job_folder_prefix())
    try:
        reaper.lifeline().add_folder(folder)
        yield Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        reaper.lifeline().drop_folder(folder)


def _remove_stale_folders_once() -> None:
    """Job folders left by drivers that are gone (killed before their reaper could act): once per driver."""
    global _stale_folders_removed
    if not _stale_folders_removed:
        _stale_folders_removed = True
        reaper.remove_stale_folders()


_stale_folders_removed = False


def _run_all(command: list[str], envs: list[dict[str, str]], timeout_s: float | None, folder: Path,
             forks: zygote.Zygote | None = None) -> tuple[int | str, list[str]]:
    """Starts one process per environment and waits for all; the first to fail stops the others (they would
    wait for it in a collective until JAX's heartbeat timeout). Returns the worst exit code and its error tail.
    Each process leads a session and process group of its own (the terminal's Ctrl-C reaches only the driver); on
    every way out (a failure, a timeout, KeyboardInterrupt) all of the job's processes are killed, their children
    and torchrun's workers included, before this returns or re-raises. ``forks``: a zygote to fork the process from
    (one process; a fresh interpreter where its environment could not be forked)."""
    logs = folder / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[tuple[subprocess.Popen[str] | zygote.ForkedProcess, IO[str]]] = []
    returncode: int | str = 0
    try:
        try:
            for index, env in enumerate(envs):
                log = open(logs / f"{index}.log", "w+")  # noqa: SIM115 -- closed below
                try:
                    proc = _start(command, env, log, forks)
                except BaseException:
                    log.close()
                    raise
                procs.append((proc, log))
                reaper.lifeline().add_group(proc.pid)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while any(proc.poll() is None for proc, _ in procs):
                failed = [proc.returncode for proc, _ in procs if proc.returncode not in (None, 0)]
                if failed or (deadline is not None and time.monotonic() > deadline):
                    returncode = failed[0] if failed else "timeout"
                    break
                time.sleep(0.05)
        finally:  # every way out: done, failed, timed out, KeyboardInterrupt (SIGTERM: install_signal_handlers)
            _stop([proc for proc, _ in procs], folder)
        codes = [proc.returncode for proc, _ in procs]
        if returncode == 0:
            returncode = next((c for c in codes if c != 0), 0)
        worst = next((i for i, c in enumerate(codes) if c not in (0, -9)), 0)
        log = procs[worst][1]
        log.seek(0)
        return returncode, log.read().strip().splitlines()[-15:]
    finally:
        for _, log in procs:
            log.close()


def _start(command: list[str], env: dict[str, str], log: IO[str],
           forks: zygote.Zygote | None) -> subprocess.Popen[str] | zygote.ForkedProcess:
    """The job's process, in a session and process group of its own: forked from ``forks`` where it can be, else a
    fresh interpreter."""
    if forks is not None and zygote.forkable(env, forks.env):
        with contextlib.suppress(OSError):  # the zygote is gone: a fresh interpreter instead
            return forks.start(command[3:], env, log.name)
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


def _stop(procs: list[subprocess.Popen[str] | zygote.ForkedProcess], folder: Path) -> None:
    """Kills whatever is left of the job (each process's group, and every process marked with the job's folder),
    waits for the processes this driver started, and releases their groups."""
    reaper.kill_job([proc.pid for proc in procs], [str(folder)])
    for proc in procs:
        proc.wait()
        reaper.lifeline().drop_group(proc.pid)


def install_signal_handlers() -> None:
    """SIGTERM in the driver raises KeyboardInterrupt in its main thread, as Ctrl-C does, so that its clean-up
    runs (finally-blocks, context managers: the running job's processes killed, its folder removed). Call it once,
    from the main thread, at the driver's start."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


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
