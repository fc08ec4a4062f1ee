"""Nothing of a job outlives the driver: SIGKILL or SIGTERM of a running ladder leaves no worker and no job folder
(experiments/execution/reaper.py); the reaper kills what is registered when its pipe closes; stale job folders of
dead drivers are removed, nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from experiments.execution import reaper

REPO = Path(__file__).resolve().parents[1]
WORKER = "experiments.execution.worker"
# the driver, with SIGTERM turned into KeyboardInterrupt (as experiments/__main__.main does once it is wired there)
WRAPPER = ("from experiments.execution.runner import install_signal_handlers; install_signal_handlers(); "
           "from experiments.__main__ import main; import sys; sys.exit(main(sys.argv[1:]))")


def _living(predicate) -> list[psutil.Process]:  # noqa: ANN001
    """Processes (zombies aside: nothing reaps the reparented ones in some containers) whose command line
    satisfies ``predicate``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and predicate(cmdline):
            found.append(proc)
    return found


def _living_with(tag: str):  # noqa: ANN202
    return lambda: _living(lambda cmdline: tag in cmdline)


def _until(condition, timeout_s: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _is_our_worker(tag: str, task: str = ""):  # noqa: ANN202
    return lambda cmdline: WORKER in cmdline and tag in " ".join(cmdline) and (not task or task in cmdline)


@contextmanager
def _ladder_with_a_running_worker(prefix: list[str], archive: Path, tmp: Path,
                                  task: str = "") -> Iterator[tuple[subprocess.Popen, Path]]:
    """A tiny torch ladder with a worker (of ``task``, if given) started: the driver and that worker's job folder.
    Whatever the test leaves running is killed at its end."""
    args = ["ladder", "--preset", "tiny", "--repeats", "1", "--no-ablations", "--framework", "torch", "--data",
            str(archive), "--results", str(tmp / "results"), "--name", "k"]
    with open(tmp / "driver.log", "w") as log:
        driver = subprocess.Popen([sys.executable, *prefix, *args], cwd=REPO, stdout=log, stderr=log,
                                  start_new_session=True)
    try:
        workers: list[psutil.Process] = []
        assert _until(lambda: bool(workers.extend(_living(_is_our_worker(str(tmp), task))) or workers)
                      or driver.poll() is not None, 120), "no worker started"
        assert driver.poll() is None, (tmp / "driver.log").read_text()[-3000:]
        yield driver, Path(workers[0].cmdline()[-1]).parent  # the worker's result file is in its job folder
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        for leftover in _living(_is_our_worker(str(tmp))):
            leftover.kill()


def _nothing_left(driver: subprocess.Popen, folder: Path, tmp: Path) -> None:
    assert _until(lambda: not _living(_is_our_worker(str(tmp))), 10), "a worker outlived the driver"
    assert _until(lambda: not folder.exists(), 10), f"{folder} left behind"
    assert folder.name.startswith(f"twinrun-{driver.pid}-")  # recognisable, were it left
    leftovers = [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(f"twinrun-{driver.pid}-")]
    assert leftovers == []


@pytest.mark.e2e
def test_a_sigkilled_driver_leaves_no_worker_and_no_job_folder(cifar100_archive, tmp_path):
    with _ladder_with_a_running_worker(["-m", "experiments"], cifar100_archive, tmp_path, "train") as (driver, folder):
        time.sleep(2)  # into its imports, or its first steps
        os.kill(driver.pid, signal.SIGKILL)  # the driver alone, no clean-up in it: the reaper's work
        assert driver.wait(10) == -signal.SIGKILL
        _nothing_left(driver, folder, tmp_path)


@pytest.mark.e2e
def test_a_sigtermed_driver_stops_its_worker_and_removes_its_job_folder(cifar100_archive, tmp_path):
    with _ladder_with_a_running_worker(["-c", WRAPPER], cifar100_archive, tmp_path) as (driver, folder):
        os.kill(driver.pid, signal.SIGTERM)
        code = driver.wait(30)
        log = (tmp_path / "driver.log").read_text()
        # not SIGTERM's default death: KeyboardInterrupt, which main() reports as interrupted (130)
        assert code != -signal.SIGTERM and (code == 130 or "KeyboardInterrupt" in log), (code, log[-3000:])
        _nothing_left(driver, folder, tmp_path)


@pytest.mark.multiprocess
def test_torchruns_workers_in_sessions_of_their_own_die_with_the_driver(tmp_path):
    """torchrun starts each of its workers in a session of its own: out of reach of its process group."""
    sleeper = f"import time; time.sleep(300)  # {tmp_path}"
    script = ("import os, sys; from experiments.execution import reaper, runner\n"
              "with runner._job_folder() as folder:\n"
              "    print(folder, flush=True)\n"
              "    command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2',\n"
              f"               '-m', 'timeit', '-n1', {sleeper!r}]\n"
              "    runner._run_all(command, [{**os.environ, reaper.MARKER: str(folder)}], None, folder)\n")
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    ours = _living_with(sleeper)
    try:
        folder = Path(driver.stdout.readline().strip())  # type: ignore[union-attr]
        assert _until(lambda: len([p for p in ours() if "-u" in p.cmdline()]) == 2, 60), "torchrun's workers"
        assert all(os.getsid(p.pid) == p.pid for p in ours() if "-u" in p.cmdline())  # sessions of their own
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert _until(lambda: not ours(), 10), [p.cmdline() for p in ours()]
        assert _until(lambda: not folder.exists(), 10)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for leftover in ours():
            leftover.kill()


def test_the_reaper_kills_and_removes_what_is_registered_when_its_pipe_closes(tmp_path):
    folder = tmp_path / "job"
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "0.log").write_text("...")
    group = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    # torchrun's workers lead sessions of their own: found by the job folder in their environment
    escaped = subprocess.Popen(["sleep", "300"], start_new_session=True, env={**os.environ, reaper.MARKER: str(folder)})
    released = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert _until(lambda: len(psutil.Process(group.pid).children()) == 2, 10)
        children = psutil.Process(group.pid).children()
        proc = subprocess.Popen([sys.executable, "-m", "experiments.execution.reaper"], stdin=subprocess.PIPE,
                                cwd=REPO, start_new_session=True)
        proc.communicate(f"+group {group.pid}\n+folder {folder}\n+group {released.pid}\n-group {released.pid}\n"
                         .encode(), timeout=20)
        assert proc.returncode == 0
        assert group.wait(5) == escaped.wait(5) == -signal.SIGKILL
        assert _until(lambda: all(not c.is_running() or c.status() == psutil.STATUS_ZOMBIE for c in children), 5)
        assert not folder.exists()
        assert released.poll() is None  # released: not the reaper's any more
    finally:
        for leftover in (group, escaped, released):
            leftover.kill()
            leftover.wait()


def test_only_job_folders_of_dead_drivers_are_stale(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    names = {"dead": f"twinrun-{gone.pid}-abc_1234", "alive": f"twinrun-{os.getppid()}-abc_1234",
             "mine": f"twinrun-{os.getpid()}-abc_1234", "other": f"twinrun-{gone.pid}-abc_1234-x",
             "cache": "twinrun-test-inductor-cache-abc_1234"}
    for name in names.values():
        (tmp_path / name).mkdir()
    (tmp_path / f"twinrun-{gone.pid}-file_123").write_text("not a folder")
    assert reaper.remove_stale_folders(str(tmp_path)) == [tmp_path / names["dead"]]
    assert all((tmp_path / names[k]).is_dir() for k in ("alive", "mine", "other", "cache"))
    assert (tmp_path / f"twinrun-{gone.pid}-file_123").is_file()
