"""Forked runs: one interpreter per framework that has imported it once, and forks a process for each run.

Why: a fresh interpreter pays its imports before anything else, and a ladder or the test suite starts hundreds of
runs. Measured here (2-core AMD EPYC, 2026-12-07): ``import torch`` 2.3 s and ``torch._dynamo`` 1.9 s (which
torch.optim's constructor imports), JAX with flax, optax and grain 2.8 s; a tiny torch run took 5.3-6.1 s as a
fresh interpreter and ~1 s forked. A forked run is still a process of its own (its own memory, compile caches,
framework state: the zygote never runs a step, never compiles, never initialises a device), started in a session
of its own as ``subprocess`` starts the others, with the job's environment and working directory.

What stays a fresh interpreter (``runner.run_isolated`` decides): runs over several processes (torchrun,
jax.distributed), runs whose result counts the wall time since the process started (time to accuracy includes the
imports a user waits for), and a job whose environment differs from the zygote's in a variable read at import
(``_differences``): OMP_NUM_THREADS, for one. ``TWINRUN_NO_FORK=1`` turns forking off. POSIX only.

The zygote (``python -m experiments.execution.zygote FRAMEWORK``) reads one request a line on stdin and answers on
stdout: ``ready`` once its imports are done, then ``started PID`` and ``exited PID CODE`` per run (CODE as
``Popen.returncode``: negative for a signal). It exits at end-of-file (its driver is gone); it is registered with
the driver's reaper, which kills it with the driver however that ends.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from experiments.execution import reaper

DISABLE = "TWINRUN_NO_FORK"
WORKER = "experiments.execution.worker"
# What a fresh worker of the framework imports before its first step (torch.optim's constructor imports
# torch._dynamo): what forking saves. Nothing that compiles or touches a device; a step's own imports (inductor's,
# at the first compiled step) stay in the step, as in a fresh interpreter.
PRELOAD: dict[str, tuple[str, ...]] = {
    "torch": ("experiments.execution.worker", "torch_impl.backend", "torch._dynamo"),
    "jax": ("experiments.execution.worker", "jax_impl.backend"),
}
# Variables a run reads after it starts (ours, inductor's cache folder, XLA's flags: read when JAX creates its
# backend), which a forked run may change freely...
_READ_AT_RUN_TIME = ("TORCHINDUCTOR_CACHE_DIR", "XLA_FLAGS")
_RUN_TIME_PREFIXES = ("TWINRUN_", "PYTEST_")
# ... and JAX options that JAX reads from the environment at import: a forked run sets them through jax.config.
_JAX_OPTIONS: dict[str, type] = {
    "JAX_COMPILATION_CACHE_DIR": str,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": float,
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": int,
}
READY_TIMEOUT_S = 300.0


def forkable(env: Mapping[str, str], zygote_env: Mapping[str, str]) -> bool:
    """Whether a run with ``env`` can be forked from a zygote started with ``zygote_env``."""
    return not _differences(env, zygote_env)


def _read_at_run_time(name: str) -> bool:
    return name in _READ_AT_RUN_TIME or name.startswith(_RUN_TIME_PREFIXES) or name in _JAX_OPTIONS


def _differences(env: Mapping[str, str], zygote_env: Mapping[str, str]) -> list[str]:
    """The variables that differ and that a forked run could not take: read at import, or a JAX option unset."""
    names = {name for name in set(env) | set(zygote_env) if env.get(name) != zygote_env.get(name)}
    return sorted(name for name in names if not _read_at_run_time(name) or (name in _JAX_OPTIONS and name not in env))


def _import_env(env: Mapping[str, str]) -> dict[str, str]:
    """A zygote's environment for runs with ``env``: the variables read at import (the run-time ones, the job's
    folder marker among them, are the run's own)."""
    return {name: value for name, value in env.items() if not _read_at_run_time(name)}


class ForkedProcess:
    """A run forked by a zygote, with the part of ``subprocess.Popen``'s interface the runner uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.collect(self, timeout_s=0.0)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self.zygote.collect(self, timeout_s=1.0)
        return self.returncode


class Zygote:
    """The driver's end of one zygote: starts it, asks it for runs, reads their ends. One run at a time (the
    runner's jobs run one after another)."""

    def __init__(self, framework: str, env: Mapping[str, str]) -> None:
        self.framework = framework
        self.env = dict(env)  # the zygote's environment: what its imports read
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, framework], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env,
                                      start_new_session=True)
        reaper.lifeline().add_group(self._proc.pid)
        self._buffer = b""
        self.running: ForkedProcess | None = None
        self.forked = 0  # runs forked so far
        line = self._line(READY_TIMEOUT_S)
        if line != "ready":
            self.close()
            raise OSError(f"the {framework} zygote did not start: {line or 'no answer'}")

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def idle(self) -> bool:
        return self.alive and (self.running is None or self.running.returncode is not None)

    def start(self, argv: list[str], env: Mapping[str, str], log_path: str) -> ForkedProcess:
        """Forks a run of ``python -m experiments.execution.worker *argv`` with ``env``, in this process's working
        directory, its output going to ``log_path``. Raises OSError where the zygote cannot (the caller starts a
        fresh interpreter instead)."""
        if not self.idle:
            raise OSError(f"the {self.framework} zygote is gone or busy")
        request = {"argv": argv, "env": dict(env), "cwd": os.getcwd(), "log": log_path}
        with self._retired_on_failure():
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
            answer = (self._line(READY_TIMEOUT_S) or "").split()
            if len(answer) != 2 or answer[0] != "started":
                raise OSError(f"the {self.framework} zygote could not fork: {' '.join(answer) or 'no answer'}")
            self.running = ForkedProcess(self, int(answer[1]))
        self.forked += 1
        return self.running

    def collect(self, run: ForkedProcess, timeout_s: float | None) -> None:
        """Reads the run's end if the zygote has told it (waits up to ``timeout_s``; None: until it has). A zygote
        that is gone, or out of step, loses its run: -SIGKILL, as the reaper's end of it would read."""
        with self._retired_on_failure():
            line = self._line(timeout_s)
        parts = (line or "").split()
        if len(parts) == 3 and parts[0] == "exited" and parts[1] == str(run.pid):
            run.returncode = int(parts[2])
        elif line is not None or not self.alive:
            self._retire()

    @contextlib.contextmanager
    def _retired_on_failure(self) -> Iterator[None]:
        """Whatever interrupts a request or its answer (an error, KeyboardInterrupt) leaves the driver and the zygote
        out of step: the zygote is then retired, and the exception goes on."""
        try:
            yield
        except BaseException:
            self._retire()
            raise

    def _retire(self) -> None:
        """Closes this zygote (its run killed with it, read as -SIGKILL) and forgets it: the next run starts another
        zygote, or a fresh interpreter."""
        if self.running is not None and self.running.returncode is None:
            self.running.returncode = -signal.SIGKILL
        self.close()
        if _ZYGOTES.get(self.framework) is self:
            del _ZYGOTES[self.framework]

    def _line(self, timeout_s: float | None) -> str | None:
        """The zygote's next line; None if none came within ``timeout_s``; "" at end-of-file."""
        fd = self._proc.stdout.fileno()  # type: ignore[union-attr]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        """Ends the zygote and whatever it still runs (the reaper's kill follows the parent links)."""
        with contextlib.suppress(OSError):
            self._proc.stdin.close()  # type: ignore[union-attr]
        reaper.kill_job([self._proc.pid])
        self._proc.wait()
        with contextlib.suppress(OSError):
            self._proc.stdout.close()  # type: ignore[union-attr]
        reaper.lifeline().drop_group(self._proc.pid)


_ZYGOTES: dict[str, Zygote] = {}
_FAILED: set[str] = set()  # frameworks whose zygote could not start: their runs start fresh interpreters


def zygote_for(framework: str, env: Mapping[str, str]) -> Zygote | None:
    """This driver's zygote for ``framework`` whose imports saw what a run with ``env`` would see, started on first
    use (None where forking is off or impossible). One started under other values (a test set OMP_NUM_THREADS, an
    import set a variable since) is replaced, at the price of one interpreter's imports."""
    if os.environ.get(DISABLE) == "1" or os.name != "posix" or framework not in PRELOAD or framework in _FAILED:
        return None
    zygote = _ZYGOTES.get(framework)
    if zygote is not None and not (zygote.idle and forkable(env, zygote.env)):
        _ZYGOTES.pop(framework).close()
        zygote = None
    if zygote is None:
        try:
            zygote = _ZYGOTES[framework] = Zygote(framework, _import_env(env))
        except OSError:
            _FAILED.add(framework)
            return None
    return zygote


_ORPHANED: list[subprocess.Popen[bytes]] = []  # a forked child's copies of its parent's zygotes (kept from __del__)


def _forget_in_child() -> None:
    """A child the driver forks (a DataLoader worker in a test) neither uses its parent's zygotes nor holds their
    pipes open (a zygote sees its driver's end as end-of-file)."""
    for zygote in _ZYGOTES.values():
        for pipe in (zygote._proc.stdin, zygote._proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        _ORPHANED.append(zygote._proc)
    _ZYGOTES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


# -- the zygote process -------------------------------------------------------------------------------------------

class _Forked(BaseException):  # noqa: N818 -- not an error: how a child leaves the zygote's loop
    """Raised in a forked child, out of the zygote's loop, to its top level, which runs the job there."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__()
        self.request = request


def serve(framework: str) -> int:
    for name in PRELOAD[framework]:
        importlib.import_module(name)
    # the requests and answers on descriptors of their own: stray prints of the imports stay off the answers
    requests, answers = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb", buffering=0)
    _redirect(os.devnull)
    if threading.active_count() != 1:
        answers.write(f"refused: {threading.active_count()} threads after the imports\n".encode())
        return 1
    gc.freeze()  # the imports' objects out of the collector's reach: a child's collections do not copy their pages
    answers.write(b"ready\n")
    for raw in requests:
        request = json.loads(raw)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a session of its own, then out of the loop (the zygote's files closed)
            os.setsid()
            os.close(ready_r)
            os.write(ready_w, b"x")
            os.close(ready_w)
            requests.close()
            answers.close()
            raise _Forked(request)
        os.close(ready_w)
        os.read(ready_r, 1)  # the child leads its session now: its group can be killed
        os.close(ready_r)
        answers.write(f"started {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        answers.write(f"exited {pid} {os.waitstatus_to_exitcode(status)}\n".encode())
    return 0


def run_job(request: dict[str, Any]) -> None:
    """In the child: the job's environment, working directory, output and signals as ``python -m`` would have them,
    then the worker run as ``__main__`` (a spawned grain worker imports it, as it would a fresh worker's); its
    ``sys.exit`` ends the interpreter as a fresh one ends (atexit handlers, threads joined, output flushed)."""
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # python -m puts the working directory first
    zygote_env = dict(os.environ)
    os.environ.clear()
    os.environ.update(request["env"])
    _redirect(request["log"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if "jax" in sys.modules:
        import jax

        for name, kind in _JAX_OPTIONS.items():
            if name in request["env"] and request["env"][name] != zygote_env.get(name):
                jax.config.update(name.lower(), kind(request["env"][name]))
    timing = sys.modules.get("common.timing")
    if timing is not None:  # this process's start is the fork's, never a reading the zygote kept
        timing.process_start_time.cache_clear()
    sys.argv = ["-m", *request["argv"]]
    runpy.run_module(WORKER, run_name="__main__", alter_sys=True)


def _redirect(log: str) -> None:
    """stdin from /dev/null; stdout and stderr to ``log``."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops it (end-of-file, or its reaper)
    try:
        sys.exit(serve(sys.argv[1]))
    except _Forked as forked:
        run_job(forked.request)
