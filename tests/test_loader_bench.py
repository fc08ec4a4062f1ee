"""``twinrun loader-bench`` measures both frameworks in their own processes and writes rows."""

from __future__ import annotations

import json

import pytest

from experiments.__main__ import main


@pytest.mark.e2e
def test_loader_bench_writes_ok_rows_for_both_frameworks(cifar100_archive, tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["loader-bench", "--data", str(cifar100_archive), "--workers", "0", "--png", "yes",
                 "--batch-size", "64", "--batches", "3", "--repeats", "2", "--out", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {(r["framework"], r["workers"], r["png"]) for r in rows} == {("torch", 0, True), ("jax", 0, True)}
    for row in rows:
        assert row["status"] == "ok"
        assert row["images_per_s"]["median"] > 0 and row["images_per_s"]["n"] == 2
    assert "images/s" in capsys.readouterr().out


def test_loader_bench_rejects_a_missing_data_path(tmp_path, capsys):
    code = main(["loader-bench", "--data", str(tmp_path / "missing.tar.gz"), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "missing.tar.gz" in err and "expected" in err
    assert not (tmp_path / "o" / "runs.jsonl").exists()
