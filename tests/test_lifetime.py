"""Nothing of a job outlives the driver: SIGKILL or SIGTERM of a running ladder leaves no worker and no job folder
(experiments/execution/reaper.py); the reaper kills what is registered when its pipe closes; stale job folders of
dead drivers are removed, nothing else."""

from __future__ import annotations

import contextlib
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

from experiments.execution import reaper, zygote

REPO = Path(__file__).resolve().parents[1]
WORKER = "experiments.execution.worker"
ZYGOTE = "experiments.execution.zygote"
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


def _jobs_of(driver: subprocess.Popen, task: str = "") -> list[psutil.Process]:
    """The driver's running jobs: fresh workers (of ``task``, if given), and runs forked by its zygotes (a forked
    run's command line is its zygote's, and its parent is the zygote: its task cannot be told from outside; in the
    ladder below, whose initial weights exist before it starts, the forked jobs are its train runs until the matmul
    rate's, at its end)."""
    jobs = []
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(driver.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmdline, parent = proc.cmdline(), proc.parent()
                forked = ZYGOTE in cmdline and parent is not None and ZYGOTE in parent.cmdline()
                if proc.status() != psutil.STATUS_ZOMBIE and (_is_our_worker("", task)(cmdline) or forked):
                    jobs.append(proc)
    return jobs


@contextmanager
def _ladder_with_a_running_worker(prefix: list[str], archive: Path, tmp: Path, task: str = "",
                                  env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, Path, list]]:
    """A tiny torch ladder with a job (of ``task``, if given) running: the driver, that job's folder, and every
    process the driver has started by then (its zygotes and reaper included). Whatever the test leaves running is
    killed at its end."""
    args = ["ladder", "--preset", "tiny", "--repeats", "1", "--no-ablations", "--framework", "torch", "--data",
            str(archive), "--results", str(tmp / "results"), "--name", "k"]
    # the ladder's shared initial weights, made here first: their job (forked from the torch zygote too) would
    # otherwise be the driver's first, and a forked job's task is not on its command line
    from experiments.execution.plan import PlanOptions, prepare, with_paired_weights

    with_paired_weights(prepare(PlanOptions(preset="tiny", framework="torch", data=str(archive),
                                            results=str(tmp / "results"), name="k"), "k"))
    with open(tmp / "driver.log", "w") as log:
        driver = subprocess.Popen([sys.executable, *prefix, *args], cwd=REPO, stdout=log, stderr=log,
                                  start_new_session=True, env=env)
    family: list[psutil.Process] = []
    try:
        assert _until(lambda: bool(_jobs_of(driver, task)) or driver.poll() is not None, 120), "no worker started"
        assert driver.poll() is None, (tmp / "driver.log").read_text()[-3000:]
        folders = list(Path(tempfile.gettempdir()).glob(f"twinrun-{driver.pid}-*"))
        assert len(folders) == 1, folders  # the running job's
        family = psutil.Process(driver.pid).children(recursive=True)
        yield driver, folders[0], family
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        for leftover in [*_living(_is_our_worker(str(tmp))), *family]:
            with contextlib.suppress(psutil.Error):
                leftover.kill()


def _nothing_left(driver: subprocess.Popen, folder: Path, family: list[psutil.Process]) -> None:
    """Nothing the driver had started is left (its jobs, forked or not, their zygotes, its reaper), nor its job
    folder."""
    def living() -> list[psutil.Process]:
        return [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    assert _until(lambda: not living(), 10), f"outlived the driver: {[p.cmdline() for p in living()]}"
    assert _until(lambda: not folder.exists(), 10), f"{folder} left behind"
    assert folder.name.startswith(f"twinrun-{driver.pid}-")  # recognisable, were it left
    leftovers = [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(f"twinrun-{driver.pid}-")]
    assert leftovers == []


@pytest.mark.e2e
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh"])
def test_a_sigkilled_driver_leaves_no_worker_and_no_job_folder(cifar100_archive, tmp_path, fork):
    env = {**os.environ, zygote.DISABLE: "0" if fork else "1"}
    with _ladder_with_a_running_worker(["-m", "experiments"], cifar100_archive, tmp_path, "train",
                                       env) as (driver, folder, family):
        jobs = _jobs_of(driver, "train")
        assert [ZYGOTE in job.cmdline() for job in jobs] == [fork]  # the path this case is about
        time.sleep(2)  # into its imports, or its first steps
        os.kill(driver.pid, signal.SIGKILL)  # the driver alone, no clean-up in it: the reaper's work
        assert driver.wait(10) == -signal.SIGKILL
        _nothing_left(driver, folder, family)


@pytest.mark.e2e
def test_a_sigtermed_driver_stops_its_worker_and_removes_its_job_folder(cifar100_archive, tmp_path):
    with _ladder_with_a_running_worker(["-c", WRAPPER], cifar100_archive, tmp_path) as (driver, folder, family):
        os.kill(driver.pid, signal.SIGTERM)
        code = driver.wait(30)
        log = (tmp_path / "driver.log").read_text()
        # not SIGTERM's default death: KeyboardInterrupt, which main() reports as interrupted (130)
        assert code != -signal.SIGTERM and (code == 130 or "KeyboardInterrupt" in log), (code, log[-3000:])
        _nothing_left(driver, folder, family)


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


# -- forked runs (experiments/execution/zygote.py) ----------------------------------------------------------------

def test_a_run_is_forked_only_where_its_environment_allows_it():
    zygote_env = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "XLA_FLAGS": ""}
    run_time = {**zygote_env, "TWINRUN_JOB_FOLDER": "/tmp/x", "TORCHINDUCTOR_CACHE_DIR": "/tmp/c",
                "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTEST_CURRENT_TEST": "t",
                "JAX_COMPILATION_CACHE_DIR": "/tmp/j", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    assert zygote.forkable(run_time, zygote_env)  # read after the start, or set through jax.config
    assert not zygote.forkable({**zygote_env, "OMP_NUM_THREADS": "2"}, zygote_env)  # read when torch is imported
    assert not zygote.forkable({**zygote_env, "JAX_ENABLE_X64": "1"}, zygote_env)  # a JAX option it does not set
    unset = {k: v for k, v in {**zygote_env, "JAX_COMPILATION_CACHE_DIR": "/tmp/j"}.items()}
    assert not zygote.forkable(zygote_env, unset)  # a JAX option the zygote has and the run has not


def test_time_to_accuracy_runs_start_a_fresh_interpreter():
    from experiments.execution.runner import _forkable

    steps = {"framework": "torch", "config": {"steps": 3, "epochs": None, "target_accuracy": None}}
    assert _forkable("train", steps) and _forkable("infer", steps)
    assert not _forkable("train", {**steps, "config": {"steps": None, "epochs": 2, "target_accuracy": None}})
    assert not _forkable("train", {**steps, "config": {"steps": 3, "epochs": None, "target_accuracy": 0.5}})
    assert not _forkable("matmul-rate", {})  # no framework named: no zygote to fork it
    assert _forkable("matmul-rate", {"framework": "torch"}) and _forkable("init-weights", {"framework": "torch"})


@pytest.mark.e2e
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_forked_run_computes_what_a_fresh_one_does_and_reads_its_own_compile_cache(
        cifar100_archive, tmp_path, monkeypatch, framework):
    """The same run forked and fresh: the same losses to the bit; and the forked JAX run compiled into the cache its
    environment names, not its zygote's (JAX reads that at import: a forked run sets it through jax.config)."""
    from common.config import RunConfig
    from experiments.execution.paired import run_framework

    config = RunConfig(data=str(cifar100_archive), model="resnet10", width=0.125, batch_size=16, steps=3, epochs=None,
                       timing_warmup=1, eval_batches=1, compile="compiled" if framework == "jax" else "eager")
    monkeypatch.setenv(zygote.DISABLE, "0")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax-cache"))  # not the zygote's
    forks = zygote.zygote_for(framework, os.environ)
    assert forks is not None
    before = forks.forked
    forked = run_framework(framework, config, timeout_s=300)
    assert forks.forked == before + 1, zygote._differences(dict(os.environ), forks.env)  # this run was forked
    monkeypatch.setenv(zygote.DISABLE, "1")
    fresh = run_framework(framework, config, timeout_s=300)
    assert forked.status == fresh.status == "ok", (forked.error, fresh.error)
    assert forked.losses == fresh.losses
    if framework == "jax":
        assert any((tmp_path / "jax-cache").iterdir())


def test_a_zygote_whose_imports_saw_other_values_is_replaced(monkeypatch):
    """A variable read at import changed (a test set it, or an import did): the next run gets a new zygote that
    imported under the run's values; a run-time variable (the job's folder, a compile cache) keeps the zygote."""
    monkeypatch.setenv(zygote.DISABLE, "0")
    first = zygote.zygote_for("torch", {**os.environ, "TWINRUN_JOB_FOLDER": "/tmp/a", "XLA_FLAGS": "-x"})
    assert first is not None and "TWINRUN_JOB_FOLDER" not in first.env  # the marker is a run's, never a zygote's
    assert zygote.zygote_for("torch", {**os.environ, "TWINRUN_JOB_FOLDER": "/tmp/b"}) is first
    threads = {**os.environ, "OMP_NUM_THREADS": "3"}
    second = zygote.zygote_for("torch", threads)
    assert second is not None and second is not first and second.env["OMP_NUM_THREADS"] == "3"
    assert not first.alive
