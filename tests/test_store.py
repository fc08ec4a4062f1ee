"""The results store holds under crashes and concurrency (SQLite, one transaction a row), never lets an unreadable
record block a read, never lets a failed attempt replace a measurement, and a resumed plan must match the
settings of the rows it resumes from. Issue 13, items 1-6 and 10."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from common.config import RunConfig
from common.errors import TwinrunError
from common.results import RunResult
from experiments.__main__ import main
from experiments.catalog.presets import PRESETS
from experiments.catalog.rungs import Device
from experiments.execution.frameworks import FRAMEWORKS
from experiments.execution.host import host_info
from experiments.execution.plan import LadderOptions, Prepared, ladder_plan
from experiments.execution.record import RunRecord
from experiments.execution.store import ResultStore, run_settings
from experiments.reporting.report import write_report

REPO = Path(__file__).resolve().parents[1]


def _row(key: str, status: str = "ok", **extra: object) -> dict:
    return {"key": key, "command": "test", "status": status, **extra}


def _ladder_rows(archive: Path, out: Path, steps: int, status: str = "ok") -> list[dict]:
    """Rows as a tiny ladder of ``steps`` steps in ``out`` would have stored them (nothing is run)."""
    base = RunConfig(**{**PRESETS["tiny"], "steps": steps}, data=str(archive))
    plan = ladder_plan(Prepared(base, out, ResultStore(out), FRAMEWORKS), 1, "tiny", LadderOptions(Device(False, 2)))
    return [RunRecord(key=job.key, command="ladder", result=RunResult(job.framework, status, error="boom"),
                      config=job.config.to_dict(), host=host_info(), fields=dict(job.fields)).to_row() for job in plan]


def test_two_processes_writing_200_rows_each_to_one_store_end_with_400(tmp_path):
    code = ("import sys; from experiments.execution.store import ResultStore\n"
            "store = ResultStore(sys.argv[1])\n"
            "for i in range(200):\n"
            "    store.add({'key': f'{sys.argv[2]}/{i}', 'status': 'ok', 'value': i})\n")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), name], cwd=REPO, stderr=subprocess.PIPE,
                                text=True) for name in "ab"]
    ended = [(w.wait(timeout=300), w.stderr.read()[-2000:]) for w in writers]
    assert [code for code, _ in ended] == [0, 0], ended
    store = ResultStore(tmp_path)
    keys = [r["key"] for r in store.rows()]
    assert len(keys) == len(set(keys)) == 400, (len(keys), len(set(keys)), [err for _, err in ended])
    exported = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert len(exported) == 400  # the last export, taken under the write lock, holds every row
    assert len((tmp_path / "runs.csv").read_text().splitlines()) == 401


def test_a_torn_line_of_an_old_runs_jsonl_is_reported_skipped_and_kept_aside(tmp_path, capsys):
    good = [_row("a"), _row("b")]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good) + '{"key": "lad')
    store = ResultStore(tmp_path)
    assert [r["key"] for r in store.rows()] == ["a", "b"]
    warning = capsys.readouterr().err
    assert "runs.jsonl, line 3" in warning and "skipped" in warning
    assert '{\\"key\\": \\"lad' in (tmp_path / "runs.rejected.jsonl").read_text()  # kept, not dropped
    store.add(_row("c"))
    assert [r["key"] for r in ResultStore(tmp_path).rows()] == ["a", "b", "c"]
    assert (tmp_path / "runs.jsonl").read_text().count("\n") == 3


def test_a_torn_line_appended_to_the_export_blocks_nothing_and_is_kept_aside(tmp_path, capsys):
    store = ResultStore(tmp_path)
    store.add(_row("a"))
    with (tmp_path / "runs.jsonl").open("a") as handle:
        handle.write('{"key": "lad')
    assert [r["key"] for r in store.rows()] == ["a"]  # the store is the database; the export is not read
    assert "runs.jsonl differs from the store's last export" in capsys.readouterr().err
    store.add(_row("b"))
    (edited,) = tmp_path.glob("runs.jsonl.edited-*")
    assert edited.read_text().endswith('{"key": "lad') and "changed outside twinrun" in capsys.readouterr().err
    assert [json.loads(line)["key"] for line in (tmp_path / "runs.jsonl").read_text().splitlines()] == ["a", "b"]


def test_a_failed_attempt_never_replaces_a_finished_row(tmp_path):
    store = ResultStore(tmp_path)
    store.add(_row("infer/torch/eager", "ok", p50=1.0))
    assert store.add(_row("infer/torch/eager", "failed", error="no timed samples")) is False
    assert store.rows() == [_row("infer/torch/eager", "ok", p50=1.0)]
    assert store.add(_row("infer/torch/eager", "ok", p50=2.0)) is True  # a new measurement does replace it
    store.add(_row("x", "failed"))
    assert store.add(_row("x", "ok")) and store.finished_keys() == {"infer/torch/eager", "x"}


def test_a_knob_a_row_did_not_record_reads_as_its_default_either_way_round():
    """A row written before a knob existed ran with its default: the same setting in whichever order two rows are
    compared (twinrun compare A B and B A), a real change named; an option the old row recorded and the new lacks is
    still a change."""
    from experiments.execution.store import changed_settings

    before, now = {"config": {"steps": 3}}, {"config": {"steps": 3, "torchcompile_backend": "inductor"}}
    assert changed_settings(before, now) == changed_settings(now, before) == []
    changed = {"config": {"steps": 3, "torchcompile_backend": "aot_eager"}}
    assert changed_settings(before, changed) == ["config.torchcompile_backend: 'inductor' -> 'aot_eager'"]
    assert changed_settings({"options": {"calls": 6}}, {}) == ["options.calls: 6 -> '(not set)'"]


def test_rows_of_other_settings_are_refused_with_what_changed(cifar100_archive, tmp_path):
    store = ResultStore(tmp_path)
    rows = _ladder_rows(cifar100_archive, tmp_path, steps=3)
    store.add_many(rows)
    key, config = rows[0]["key"], RunConfig.from_dict(rows[0]["config"])
    with pytest.raises(TwinrunError, match=r"config\.steps: 3 -> 7.*--fresh"):
        store.check_resumable({key: run_settings(config.replace(steps=7).to_dict(), host_info())})
    newer = {**host_info(), "versions": {**host_info()["versions"], "torch": "9.9"}}
    with pytest.raises(TwinrunError, match=r"host\.versions\.torch"):
        store.check_resumable({key: run_settings(config.to_dict(), newer)})
    # the same settings resume; the test hooks and the weights' path are not settings
    same = config.replace(init_weights="elsewhere.npz", fail_after_step=1)
    store.check_resumable({key: run_settings(same.to_dict(), host_info())})


def test_a_ladder_with_changed_steps_is_not_answered_from_old_rows(cifar100_archive, tmp_path, capsys):
    folder = tmp_path / "t"
    ResultStore(folder).add_many(_ladder_rows(cifar100_archive, folder, steps=3))
    before = ResultStore(folder).rows()
    code = main(["ladder", "--preset", "tiny", "--steps", "7", "--repeats", "1", "--data", str(cifar100_archive),
                 "--results", str(tmp_path), "--name", "t"])
    err = capsys.readouterr().err
    assert code == 2 and "config.steps: 3 -> 7" in err and "--fresh" in err and "Traceback" not in err
    assert "give another --name or --results" in err and "--out" not in err  # the ladder's own flags (issue 26)
    assert ResultStore(folder).rows() == before


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusals
        return int(exc.code)


def test_fresh_with_a_bad_argument_leaves_the_old_results_in_place(cifar100_archive, tmp_path, capsys):
    folder = tmp_path / "t"
    ResultStore(folder).add_many(_ladder_rows(cifar100_archive, folder, steps=3))
    before = ResultStore(folder).rows()
    plan = ["ladder", "--preset", "tiny", "--repeats", "1", "--results", str(tmp_path), "--name", "t", "--fresh"]
    for bad, named in ((["--data", str(tmp_path / "nope.tar.gz")], "nope.tar.gz"), (["--steps", "0"], "steps")):
        assert _exit_code([*plan, *bad]) == 2
        assert named in capsys.readouterr().err
        assert ResultStore(folder).rows() == before and not (folder / "old").exists()


def test_fresh_moves_the_old_results_aside_and_deletes_nothing(tmp_path):
    store = ResultStore(tmp_path)
    store.add(_row("a"))
    (tmp_path / "report.md").write_text("old report")
    moved = store.move_aside()
    assert moved is not None and moved.parent == tmp_path / "old"
    assert {p.name for p in moved.iterdir()} >= {"runs.sqlite", "runs.jsonl", "runs.csv", "report.md"}
    assert store.rows() == [] and ResultStore(moved).rows() == [_row("a")]


def test_the_report_of_a_folder_where_every_run_failed_is_written(cifar100_archive, tmp_path):
    ResultStore(tmp_path).add_many(_ladder_rows(cifar100_archive, tmp_path, steps=3, status="failed"))
    report = write_report(tmp_path).path.read_text()
    assert "No plots: no run in this folder finished" in report and "boom" in report


def test_files_follow_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        store = ResultStore(tmp_path / "r")
        store.add(_row("a", "failed", framework="torch", error="boom"))
        write_report(tmp_path / "r")
    finally:
        os.umask(previous)
    for name in ("runs.sqlite", "runs.jsonl", "runs.csv", "report.md"):
        assert stat.S_IMODE((tmp_path / "r" / name).stat().st_mode) == 0o644, name


# -- issue 26: nothing lost, nothing mixed ----------------------------------------------------------------------------


def _stand_in_runs(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    """execute() without real runs: each "run" writes its TensorBoard scalars and finishes ok; no matmul rate."""
    from experiments.execution import plan

    def run(framework: str, config: RunConfig, timeout_s: float | None = None, cache_dir: str | None = None):
        folder = Path(config.tensorboard_dir) / framework
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "events").write_text(f"attempt {len(calls) + 1}")
        calls.append(framework)
        return RunResult(framework, "ok", losses=[1.0])

    monkeypatch.setattr(plan, "run_framework", run)
    monkeypatch.setattr(plan, "ensure_matmul_rate", lambda store, timeout_s: None)


def test_fresh_moves_the_tensorboard_scalars_aside_and_a_retry_replaces_only_a_failed_attempts(tmp_path, monkeypatch):
    """Item 1: --fresh deleted the previous scalars (tensorboard/<rung>/<framework>) instead of moving them aside."""
    from rich.console import Console

    from experiments.execution.plan import PlannedRun, execute

    calls: list[str] = []
    _stand_in_runs(monkeypatch, calls)
    config = RunConfig(source="synthetic", steps=3, epochs=None, tensorboard_dir=str(tmp_path / "tensorboard" / "b-r0"))
    job = PlannedRun(key="ladder/b/torch/r0", framework="torch", config=config, label="b", command="ladder")
    store, quiet = ResultStore(tmp_path), Console(quiet=True)
    execute([job], store, "ladder", None, quiet)
    scalars = tmp_path / "tensorboard" / "b-r0" / "torch" / "events"
    assert scalars.read_text() == "attempt 1"
    execute([job], store, "ladder", None, quiet, fresh=True)
    (old,) = (tmp_path / "old").iterdir()
    assert (old / "tensorboard" / "b-r0" / "torch" / "events").read_text() == "attempt 1"  # moved, not deleted
    assert (old / "runs.sqlite").exists() and scalars.read_text() == "attempt 2"
    with closing(store._open()) as db:
        db.execute("DELETE FROM rows")
    store.add(RunRecord(key=job.key, command="ladder", result=RunResult("torch", "failed", error="boom"),
                        config=config.to_dict(), host=host_info()).to_row())  # the row of a failed attempt
    execute([job], store, "ladder", None, quiet)
    assert scalars.read_text() == "attempt 3" and len(list((tmp_path / "old").iterdir())) == 1  # its own replaced
    with closing(store._open()) as db:
        db.execute("DELETE FROM rows")  # scalars without a row: kept aside, never deleted
    execute([job], store, "ladder", None, quiet)
    assert scalars.read_text() == "attempt 4"
    assert sorted(p.read_text() for p in (tmp_path / "old").rglob("events")) == ["attempt 1", "attempt 3"]


def test_a_full_disk_keeps_a_finished_row_pending_and_the_next_write_imports_it(tmp_path, monkeypatch, capsys):
    """Item 2: a full disk (sqlite's "disk I/O error") lost a finished run's row and ended in a traceback."""
    import numpy as np

    from experiments.commands import run as run_command

    weights = tmp_path / "init.npz"
    np.savez(weights, w=np.zeros(2))
    monkeypatch.setattr(run_command, "run_framework", lambda framework, config, timeout: RunResult(
        framework, "ok", losses=[1.0]))
    argv = ["run", "--framework", "torch", "--source", "synthetic", "--init-weights", str(weights), "--out",
            str(tmp_path / "out")]

    def full(self: ResultStore, rows: list) -> list:
        raise sqlite3.OperationalError("disk I/O error")

    real_insert = ResultStore._insert  # the store's own write, put back once the disk has room again

    monkeypatch.setattr(ResultStore, "_insert", full)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    pending = tmp_path / "out" / "runs.pending.jsonl"
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "could not store the row(s) of run/torch/" in err and "disk I/O error" in err and str(pending) in err
    (kept,) = [json.loads(line) for line in pending.read_text().splitlines()]
    assert kept["status"] == "ok" and ResultStore(tmp_path / "out").finished_keys() == {kept["key"]}  # read back
    monkeypatch.setattr(ResultStore, "_insert", real_insert)
    assert main(argv) == 0  # the next run of the same command imports it first
    assert not pending.exists() and kept["key"] in ResultStore(tmp_path / "out").finished_keys()
    assert len(ResultStore(tmp_path / "out").rows()) == 2
    # neither the store nor its folder can take the row: it goes to the user's cache folder, named there
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ResultStore, "_insert", full)
    pending.mkdir()  # cannot be appended to
    with pytest.raises(TwinrunError, match=r"kept in .*home/\.cache/twinrun/twinrun-pending-") as info:
        ResultStore(tmp_path / "out").add(_row("c"))
    assert "\n" not in str(info.value)
    pending.rmdir()
    monkeypatch.setattr(ResultStore, "_insert", real_insert)
    ResultStore(tmp_path / "out").start({}, fresh=False)
    assert "c" in ResultStore(tmp_path / "out").finished_keys()
    assert not list((tmp_path / "home").rglob("*.jsonl"))

HOLDER = """
import sys, time
from pathlib import Path
from experiments.execution.store import folder_lock
with folder_lock(Path(sys.argv[1]), "ladder", "another --name"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_one_folder_one_job_a_second_is_refused_and_a_dead_jobs_lock_is_taken_over(cifar100_archive, tmp_path,
                                                                                   capsys):
    """Item 5: two ladders on one folder both measured every key and overwrote each other's rows."""
    folder = tmp_path / "k"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = main(["ladder", "--preset", "tiny", "--framework", "torch", "--repeats", "1", "--no-ablations",
                     "--rungs", "compile", "--data", str(cifar100_archive), "--results", str(tmp_path), "--name", "k"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"{folder} is in use by another twinrun job (pid {holder.pid}, twinrun ladder, since" in err
        assert "another --name or --results" in err
        assert not (tmp_path / "initial-weights").exists()  # refused before anything was made
    finally:
        holder.kill()  # SIGKILL: its lock file stays behind, naming a dead process
        holder.wait()
    assert f"pid {holder.pid}" in (folder / ".lock").read_text()
    with ResultStore(folder).locked("infer", "another --out") as lock:
        assert lock.read_text().startswith(f"pid {os.getpid()}, twinrun infer")
    assert "taken over" in capsys.readouterr().err and not (folder / ".lock").exists()


def _infer_row(framework: str, variant: str, accuracy: float = 0.5, **options: object) -> dict:
    """A finished inference row as infer_rows makes it (nothing measured)."""
    return {"key": f"infer/{framework}/{variant}", "command": "infer", "framework": framework, "variant": variant,
            "status": "ok", "config": RunConfig(source="synthetic").to_dict(), "host": host_info(),
            "options": {"calls": 100, "warmup": 10, **options}, "training": {}, "device": "cpu",
            "latency_b1_ms": {"p50": 1.0, "p99": 2.0, "min": 1.0, "n": 100}, "first_call_s": 0.1,
            "throughput": {"32": {"images_per_s": 100.0, "median_ms": 320.0}}, "accuracy": accuracy,
            "eval_samples": 400, "num_classes": 4, "note": "stand-in"}


def test_infer_resumes_per_variant_and_says_when_it_reuses_weights(tmp_path, monkeypatch, capsys):
    """Item 7: a rerun re-measured and replaced finished variants, and said "training" while reusing weights."""
    from experiments.commands import infer
    from experiments.execution.inference import trained_weights_path

    measured: list[tuple[str, tuple[str, ...], float | None]] = []

    def stand_in(framework, config, weights, variants, options, training, timeout_s, reference=None):
        measured.append((framework, tuple(variants), reference))
        return [{**_infer_row(framework, v, accuracy=0.75 if v == "eager" else 0.5), "options": options.to_dict()}
                for v in variants]

    monkeypatch.setattr(infer, "infer_rows", stand_in)
    monkeypatch.setattr(infer, "write_report", lambda out: type("R", (), {"table": "", "path": out / "report.md"}))
    out = tmp_path / "infer"
    base = ["infer", "--framework", "torch", "--source", "synthetic", "--out", str(out)]
    argv = [*base, "--train-epochs", "0"]
    assert main([*argv, "--variants", "eager", "compiled"]) == 0
    assert main([*argv, "--variants", "eager", "compiled"]) == 0  # everything finished: nothing measured again
    assert main([*argv, "--variants", "eager", "compiled", "int8"]) == 0
    assert measured == [("torch", ("eager", "compiled"), None), ("torch", ("int8",), 0.75)]  # eager's, stored
    assert "kept 2 variant(s) measured earlier with the same settings" in capsys.readouterr().out
    # weights trained by an earlier run are reused, and said so, never "training"
    config = RunConfig(source="synthetic")
    path = trained_weights_path(config, 1, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    monkeypatch.setattr(infer, "train_weights", lambda config, epochs, out, timeout: (str(path), {"epochs": 1}))
    assert main([*base, "--train-epochs", "1", "--variants", "eager", "--fresh"]) == 0
    said = capsys.readouterr().out
    assert f"reusing the weights trained earlier for 1 epoch: {path}" in said and "training" not in said


def _damage(path: Path, start: int, length: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[start:start + length] = os.urandom(length)
    path.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("where", ["start", "middle"])
def test_a_damaged_store_is_named_kept_and_recoverable_from_its_export(where, tmp_path, capsys):
    """Item 9: a corrupt runs.sqlite (garbage at the start, or mid-file) ended in sqlite3.DatabaseError."""
    store = ResultStore(tmp_path)
    store.add_many([_row(f"k{i}", value="x" * 3000) for i in range(20)])  # several pages
    size = store.path.stat().st_size
    damaged = _damage(store.path, 0 if where == "start" else 4096, 100 if where == "start" else size - 8192)
    for argv in (["report", str(tmp_path)], ["ladder", "--preset", "tiny", "--data", str(tmp_path / "unread.tar.gz"),
                                              "--results", str(tmp_path.parent), "--name", tmp_path.name]):
        code = main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"{store.path} is not a twinrun store or is damaged" in err and "it is left as it is" in err
        assert f"mv {store.path} {store.path}.damaged" in err and f"it imports {store.jsonl}" in err
        assert store.path.read_bytes() == damaged  # kept as it was
    os.replace(store.path, f"{store.path}.damaged")  # the way back the error gives
    assert [r["key"] for r in ResultStore(tmp_path).rows()] == [f"k{i}" for i in range(20)]


@contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only for this process: its mode for a user; for root, whom modes do not stop, a read-only
    bind mount of it (skipped where root may not mount)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"running as root without mount: no read-only folder to test ({mounted.stderr!r})")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_report_reads_a_read_only_folder(tmp_path, capsys):
    """Item 10: report on a read-only results folder raised sqlite3.OperationalError (its read opened the database
    for writing); report.md and its plots go to --out, or the one line says they cannot be written there."""
    folder = tmp_path / "ro"
    ResultStore(folder).add(_infer_row("torch", "eager"))
    before = sorted(os.listdir(folder))
    with _read_only(folder):
        with pytest.raises(OSError):
            (folder / "probe").write_text("")
        assert main(["report", str(folder)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "report.md and its plots cannot be written there; give --out DIR" in err
        assert main(["report", str(folder), "--out", str(tmp_path / "elsewhere")]) == 0, capsys.readouterr().err
        assert [r["key"] for r in ResultStore(folder).rows()] == ["infer/torch/eager"]
    assert "| torch | eager | ok |" in (tmp_path / "elsewhere" / "report.md").read_text()
    assert sorted(os.listdir(folder)) == before  # nothing written there


def test_torch_onnx_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """Item 14: every torch ONNX variant left a /tmp/twinrun-onnx-* folder behind."""
    import tempfile

    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from torch_impl import inference

    def export(model: object, path: Path, image_size: int) -> Path:  # a one-node graph stands in for the model
        node = helper.make_node("Identity", ["images"], ["logits"])
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, None)],
                                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    monkeypatch.setattr(inference, "_export_onnx", export)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    predict, note = inference._onnxruntime(None, RunConfig(), type("Arch", (), {"inputs": "images"})())
    assert predict(np.zeros((1, 32, 32, 3), np.float32)).shape == (1, 3, 32, 32) and "opset 17" in note
    assert list(tmp_path.iterdir()) == []


def test_an_inference_report_never_mixes_settings_under_one_header_and_flags_chance(tmp_path, monkeypatch):
    """Item 16: torch and JAX rows measured with different --calls shared one header; 0.250 of 4 classes is chance."""
    from experiments.reporting import report

    monkeypatch.setattr(report, "plot_latency", lambda rows, path: None)
    ResultStore(tmp_path).add_many([_infer_row("torch", "eager", accuracy=0.25),
                                    _infer_row("torch", "compiled", accuracy=0.9),
                                    _infer_row("jax", "eager", accuracy=0.26, calls=10)])
    written = report.write_report(tmp_path)
    text = written.path.read_text()
    assert "this folder holds inference rows measured with 2 different settings" in text
    assert "## Settings 2 of 2 (infer/jax/eager)" in text and "options.calls: 100 -> 10" in text
    assert text.count("| framework | variant |") == 2 and "settings 2 of 2" in written.table
    assert "| 0.250 (chance level) |" in text and "| 0.260 (chance level) |" in text and "| 0.900 |" in text
    from experiments.reporting.accuracy import at_chance

    assert at_chance(0.27, 4, 500) and not at_chance(0.35, 4, 500) and not at_chance(0.25, None, None)


def test_infer_defaults_a_text_models_batching_to_buckets(tmp_path, monkeypatch):
    """Item 16: with pad-longest, the default 100 batch-1 calls of text-micro are 65 padded lengths, each compiled
    by JAX (eager too): its side did not finish in 300 s on 2 cores. Buckets: 5 lengths (8 s of warm-up)."""
    from experiments.__main__ import build_parser
    from experiments.commands.infer import inference_config

    def config(*argv: str) -> RunConfig:
        return inference_config(build_parser().parse_args(["infer", "--model", "text-micro", "--data",
                                                           str(tmp_path), *argv]))

    assert config().batching == "bucket"
    assert config("--batching", "pad-longest").batching == "pad-longest"
    toml = tmp_path / "run.toml"
    toml.write_text('[data]\nbatching = "pad-max"\n')
    assert config("--config", str(toml)).batching == "pad-max"
    assert inference_config(build_parser().parse_args(["infer", "--source", "synthetic"])).batching == "pad-longest"
