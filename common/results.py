"""Result rows in an atomically written JSONL store, so an interrupted sweep loses nothing and resumes."""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class ResultStore:
    """Rows keyed by ``row['key']``; adding a row with an existing key replaces the old one."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def rows(self) -> list[Row]:
        if not self.path.exists():
            return []
        rows = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"corrupt results file {self.path}, line {number}: {exc}") from None
        return rows

    def finished_keys(self) -> set[str]:
        return {row["key"] for row in self.rows() if row.get("status") in ("ok", "diverged")}

    def add(self, row: Row) -> None:
        self.add_many([row])

    def add_many(self, new_rows: Iterable[Row]) -> None:
        new_rows = list(new_rows)
        replaced = {row["key"] for row in new_rows}
        rows = [row for row in self.rows() if row.get("key") not in replaced] + new_rows
        atomic_write_text(self.path, "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in rows))

    def clear(self) -> None:
        if self.path.exists():
            self.path.unlink()

    def write_csv(self, path: str | Path) -> None:
        rows = self.rows()
        columns = sorted({k for row in rows for k, v in row.items() if not isinstance(v, (dict, list))})
        with tempfile.NamedTemporaryFile("w", delete=False, dir=Path(path).parent, suffix=".tmp", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(handle.name, path)
