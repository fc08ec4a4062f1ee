"""A results folder's store: ``runs.sqlite`` (stdlib sqlite3 in WAL mode) holds its rows; ``runs.jsonl`` and
``runs.csv`` are exports, rewritten after every write, for ``report`` and for users.

Why SQLite: every row is one committed transaction, so a killed driver loses at most the row it was writing;
concurrent writers (two sweeps into one ``--name``) serialize on the database's write lock instead of losing
each other's rows, as whole-file rewrites did (two writers of 150 rows each left 153). A record that cannot be
read is skipped with a warning naming its file and line (or key) and kept aside in ``runs.rejected.jsonl``: one
bad record never blocks a read. A folder written before the store (a ``runs.jsonl`` alone) is imported on first
use, torn lines included.

Resume matches settings as well as keys: ``run_settings`` is what a row's measurement depends on (its config,
library versions and device, and the command's own options), and ``changed_settings`` says what differs."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from common.errors import TwinrunError
from common.results import Row, RunRecord

FINISHED = ("ok", "diverged")  # a row of these is a measurement; a failed or skipped row never replaces one
DATABASE = "runs.sqlite"
EXPORTS = ("runs.jsonl", "runs.csv")
REJECTED = "runs.rejected.jsonl"
OLD = "old"  # --fresh moves earlier results to OLD/<time>/ in the same folder
# Config keys a measurement does not depend on: the path of the (digest-named) initial weights, and test hooks.
NOT_SETTINGS = ("init_weights", "tensorboard_dir", "fail_after_step", "inject_inf_at_step")
HOST_SETTINGS = ("python", "machine", "cpus", "cpu_model", "gpus", "versions", "capabilities")
_SETUP_ATTEMPTS = 40
_TABLES = """
CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY, status TEXT, written REAL, row TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT);
"""


class ResultsError(TwinrunError):
    """A results folder cannot be read or written as asked."""


def warn(message: str) -> None:
    print(f"twinrun: warning: {message}", file=sys.stderr)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: readers see the old or the new file. The
    file's mode follows the umask, as a plain ``open`` would make it (mkstemp's own is 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def writable_folder(path: str | Path, name: str) -> Path:
    """``path`` as a folder made (with its parents) and proven writable by creating a file in it; a ResultsError
    naming it (``name``: the flag, such as --out) otherwise, before any run starts."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ResultsError(f"{name} {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        blocking = next((p for p in folder.parents if p.exists() and not p.is_dir()), None)
        reason = f"{blocking} is a file" if blocking is not None else exc.strerror or str(exc)
        raise ResultsError(f"{name} {folder}: cannot write there ({reason})") from None
    return folder


def run_settings(config: dict[str, Any], host: dict[str, Any], options: dict[str, Any] | None = None) -> Row:
    """What a measurement depends on beyond its key: the run's config, the host's versions and device, and the
    command's own options (inference calls, ...)."""
    settings: Row = {"config": {k: v for k, v in config.items() if k not in NOT_SETTINGS},
                     "host": {k: host[k] for k in HOST_SETTINGS if k in host}}
    if options:
        settings["options"] = options
    return settings


def row_settings(row: Row) -> Row:
    return run_settings(row.get("config") or {}, row.get("host") or {}, row.get("options"))


def changed_settings(old: Row, new: Row) -> list[str]:
    """'config.steps: 3 -> 7' for each setting that differs. A setting the old row did not record (a row written
    before it existed) is not compared: nothing says it differed."""
    flat_old, flat_new = _flatten(old), _flatten(new)
    return [f"{name}: {flat_old[name]!r} -> {flat_new.get(name, '(not set)')!r}"
            for name in sorted(flat_old) if name in flat_new and flat_old[name] != flat_new[name]
            or name not in flat_new and flat_old[name] is not None]


def _flatten(values: Row, prefix: str = "") -> Row:
    flat: Row = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return flat


class ResultStore:
    """Rows keyed by ``row['key']``: adding a row with an existing key replaces it, unless the new row did not
    finish and the old one did (a failed attempt never replaces a measurement)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / DATABASE
        self.jsonl = self.folder / EXPORTS[0]
        self.csv = self.folder / EXPORTS[1]
        self.rejected = self.folder / REJECTED
        self._export_checked = False

    def exists(self) -> bool:
        return self.path.exists() or self.jsonl.exists()

    # -- reading ----------------------------------------------------------------------------------------------

    def rows(self) -> list[Row]:
        """Every readable row, oldest first; an unreadable record is skipped with a warning (and kept aside)."""
        if not self.path.exists():
            if not self.jsonl.exists():
                return []
            try:
                self._open().close()  # a folder from before the store: import its runs.jsonl
            except (OSError, ResultsError, sqlite3.OperationalError):
                return [row for row, _ in _parse_lines(self.jsonl, warn_bad=True)]  # read-only: in memory
        with closing(self._open()) as db:
            stored = db.execute("SELECT key, row FROM rows ORDER BY rowid").fetchall()
            self._check_export(db)
        rows = []
        for key, text in stored:
            try:
                rows.append(json.loads(text))
            except json.JSONDecodeError as exc:
                warn(f"{self.path}: the record of key {key!r} is not valid JSON ({exc}); skipped")
        return rows

    def records(self) -> list[RunRecord]:
        """The stored run rows, typed (rows of other kinds, such as a device measurement, are left out)."""
        records = []
        for row in self.rows():
            if "framework" in row:
                try:
                    records.append(RunRecord.from_row(row))
                except (KeyError, TypeError, ValueError) as exc:
                    warn(f"{self.path}: the row of key {row.get('key')!r} does not read as a run ({exc}); skipped")
        return records

    def finished(self) -> dict[str, Row]:
        """key -> row of the rows that finished (ok or diverged): a rerun does not repeat them."""
        return {row["key"]: row for row in self.rows() if row.get("status") in FINISHED}

    def finished_keys(self) -> set[str]:
        return set(self.finished())

    def check_resumable(self, planned: dict[str, Row]) -> None:
        """Refuses to go on with planned keys (key -> ``run_settings`` of the new run) whose finished rows were
        measured with other settings (another ``--steps``, ``--devices``, library version or device): they would
        be presented as this command's results."""
        finished = self.finished()
        clashes = [(key, changed) for key, settings in planned.items() if key in finished
                   if (changed := changed_settings(row_settings(finished[key]), settings))]
        if clashes:
            key, changed = clashes[0]
            more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
            raise ResultsError(f"{self.folder} holds finished runs measured with other settings, e.g. {key}{more}: "
                               f"{'; '.join(changed[:6])}. Rerun with --fresh to move the old results to "
                               f"{self.folder / OLD}/ and start over, or give another --name / --out.")

    def start(self, planned: dict[str, Row], fresh: bool) -> Path | None:
        """The start of a command that writes ``planned`` keys (key -> ``run_settings``), once every argument has
        been checked: with ``fresh``, the earlier results are moved aside (returns where to); otherwise rows of
        other settings are refused (``check_resumable``)."""
        if fresh:
            return self.move_aside()
        self.check_resumable(planned)
        return None

    # -- writing ----------------------------------------------------------------------------------------------

    def add(self, row: Row) -> bool:
        """Stores ``row``; False if an earlier finished row of its key was kept instead of this unfinished one."""
        return not self.add_many([row])

    def add_many(self, new_rows: Iterable[Row]) -> list[Row]:
        """Stores the rows in one transaction; returns the new rows that were not stored because an earlier
        finished row of the same key was kept."""
        kept_old = []
        with self._writing() as db:
            for row in new_rows:
                old = db.execute("SELECT status FROM rows WHERE key = ?", (row["key"],)).fetchone()
                if old and old[0] in FINISHED and row.get("status") not in FINISHED:
                    kept_old.append(row)
                    continue
                db.execute("INSERT OR REPLACE INTO rows (key, status, written, row) VALUES (?, ?, ?, ?)",
                           (row["key"], row.get("status"), time.time(), json.dumps(row, sort_keys=True, default=str)))
        self.export()
        return kept_old

    def export(self) -> None:
        """Rewrites runs.jsonl and runs.csv from the database, under its write lock (so concurrent writers'
        exports are serialized and the last one holds every row). An export changed by hand since twinrun
        wrote it is kept aside first, never overwritten."""
        with self._writing() as db:
            texts = [text for (text,) in db.execute("SELECT row FROM rows ORDER BY rowid")]
            jsonl = "".join(text + "\n" for text in texts)
            last = dict(db.execute("SELECT name, value FROM meta").fetchall()).get("export_digest")
            if last is not None and self.jsonl.exists() and _digest(
                    self.jsonl.read_text(encoding="utf-8", errors="replace")) != last:
                aside = self.jsonl.with_name(f"{self.jsonl.name}.edited-{time.strftime('%Y%m%d-%H%M%S')}")
                os.replace(self.jsonl, aside)
                warn(f"{self.jsonl} was changed outside twinrun since its last export; kept as {aside} (the store "
                     f"is {self.path}; runs.jsonl is rewritten from it)")
            atomic_write_text(self.jsonl, jsonl)
            atomic_write_text(self.csv, _csv_text([json.loads(t) for t in texts]))
            db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('export_digest', ?)", (_digest(jsonl),))

    def _check_export(self, db: sqlite3.Connection) -> None:
        """Warns, once per store object, when runs.jsonl is not what twinrun last exported (a line appended or
        torn by hand or by another tool): readers of the store are not affected, and the next write keeps that
        file aside before exporting anew."""
        if self._export_checked or not self.jsonl.exists():
            return
        self._export_checked = True
        last = db.execute("SELECT value FROM meta WHERE name = 'export_digest'").fetchone()
        if last is not None and _digest(self.jsonl.read_text(encoding="utf-8", errors="replace")) != last[0]:
            warn(f"{self.jsonl} differs from the store's last export (changed outside twinrun?); the rows are read "
                 f"from {self.path}, and the next write keeps that file aside as {self.jsonl.name}.edited-<time>")

    def move_aside(self) -> Path | None:
        """Moves the folder's results (store, exports, report and plots) to ``old/<time>/`` in the same folder,
        for ``--fresh``: nothing is deleted. Returns where they went (None: there was nothing)."""
        if self.path.exists():
            with closing(self._open()) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        names = [DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm", *EXPORTS, REJECTED, "report.md"]
        moving = [self.folder / n for n in names if (self.folder / n).exists()]
        moving += sorted(self.folder.glob("*.png")) + sorted(self.folder.glob(f"{EXPORTS[0]}.edited-*"))
        if not moving:
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = self.folder / OLD / stamp, 1
        while target.exists():
            target, n = self.folder / OLD / f"{stamp}-{n}", n + 1
        target.mkdir(parents=True)
        for path in moving:
            os.replace(path, target / path.name)
        return target

    def check_writable(self) -> None:
        """A clear error now, not a traceback after the first run, if results cannot be written here."""
        writable_folder(self.folder, "results folder")

    # -- the database -----------------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        """A connection in autocommit mode (transactions are explicit), creating the database if needed and
        importing a runs.jsonl written before it."""
        created = not self.path.exists()
        if created:
            self.check_writable()
        for attempt in range(_SETUP_ATTEMPTS):
            db = sqlite3.connect(self.path, timeout=120.0, isolation_level=None)
            try:
                self._set_up(db, created)
                break
            except sqlite3.OperationalError as exc:
                db.close()
                # Two processes creating one database at once: switching it to WAL can answer "locked" at once,
                # without waiting for the busy timeout. WAL is a property of the file: the next try finds it set.
                if "locked" not in str(exc) or attempt == _SETUP_ATTEMPTS - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
            except BaseException:
                db.close()
                raise
        if created:
            self.path.chmod(0o666 & ~_umask())
        return db

    def _set_up(self, db: sqlite3.Connection, created: bool) -> None:
        db.execute("PRAGMA busy_timeout = 120000")
        if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")  # a committed row survives a power cut too
        db.executescript(_TABLES)
        if created or not db.execute("SELECT 1 FROM meta WHERE name = 'imported'").fetchone():
            self._import_jsonl(db)

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, begun IMMEDIATE: it takes the write lock first, so writers wait their turn."""
        with closing(self._open()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _import_jsonl(self, db: sqlite3.Connection) -> None:
        """Imports the rows of a runs.jsonl written before the store, once (the first writer to get the lock)."""
        db.execute("BEGIN IMMEDIATE")
        try:
            if not db.execute("SELECT 1 FROM meta WHERE name = 'imported'").fetchone():
                if self.jsonl.exists() and not db.execute("SELECT 1 FROM rows LIMIT 1").fetchone():
                    for row, _ in _parse_lines(self.jsonl, warn_bad=True, keep_aside=self.rejected):
                        db.execute("INSERT OR REPLACE INTO rows (key, status, written, row) VALUES (?, ?, ?, ?)",
                                   (row["key"], row.get("status"), time.time(), json.dumps(row, sort_keys=True)))
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('export_digest', ?)",
                               (_digest(self.jsonl.read_text(encoding="utf-8")),))
                db.execute("INSERT INTO meta VALUES ('imported', '1')")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def _parse_lines(path: Path, warn_bad: bool, keep_aside: Path | None = None) -> list[tuple[Row, int]]:
    """The rows of a JSONL file with their line numbers; a line that is not a JSON object with a key (a torn
    last line of a killed writer, say) is skipped with a warning and, with ``keep_aside``, appended there."""
    rows, bad = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "key" not in row:
                raise ValueError("not a row: no 'key'")
        except ValueError as exc:
            bad.append(line)
            if warn_bad:
                aside = f"; kept in {keep_aside}" if keep_aside else ""
                warn(f"{path}, line {number}: not a readable row ({exc}); skipped{aside}")
            continue
        rows.append((row, number))
    if bad and keep_aside is not None:
        with keep_aside.open("a", encoding="utf-8") as handle:
            handle.write("".join(json.dumps({"file": str(path), "line": text}) + "\n" for text in bad))
    return rows


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _csv_text(rows: list[Row]) -> str:
    """The rows' scalar columns as CSV (nested values stay in runs.jsonl)."""
    columns = sorted({k for row in rows for k, v in row.items() if not isinstance(v, (dict, list))})
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
