"""A results folder's store: ``runs.sqlite`` (stdlib sqlite3 in WAL mode) holds its rows; ``runs.jsonl`` and
``runs.csv`` are exports, rewritten after every write, for ``report`` and for users.

Why SQLite: every row is one committed transaction, so a killed driver loses at most the row it was writing;
concurrent writers (two sweeps into one ``--name``) serialize on the database's write lock instead of losing
each other's rows, as whole-file rewrites did (two writers of 150 rows each left 153). A record that cannot be
read is skipped with a warning naming its file and line (or key) and kept aside in ``runs.rejected.jsonl``: one
bad record never blocks a read. A folder written before the store (a ``runs.jsonl`` alone) is imported on first
use, torn lines included.

Resume matches settings as well as keys: ``run_settings`` is what a row's measurement depends on (its config,
library versions and device, and the command's own options), and ``changed_settings`` says what differs.

Nothing finished is lost: a row that cannot be written (a full disk: sqlite's "disk I/O error", ENOSPC) is kept in
``runs.pending.jsonl`` beside the store (or, if even that cannot be written, in the user's cache or temporary
folder), named in the one-line error, and imported by the next command that writes the folder. A damaged
``runs.sqlite`` is named and left as it is, with the way back from its ``runs.jsonl`` export. Reading needs no
write access (a read-only connection). One folder, one running job: ``folder_lock`` (``.lock``, an flock held by
the job's process, so a dead job's lock is free again)."""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import hashlib
import io
import json
import os
import sqlite3
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager, suppress
from pathlib import Path
from typing import Any

from common.config import RunConfig
from common.errors import TwinrunError
from common.results import Row
from experiments.execution.record import RunRecord

FINISHED = ("ok", "diverged")  # a row of these is a measurement; a failed or skipped row never replaces one
DATABASE = "runs.sqlite"
EXPORTS = ("runs.jsonl", "runs.csv")
REJECTED = "runs.rejected.jsonl"
PENDING = "runs.pending.jsonl"  # rows the store could not take (a full disk), imported by the next write
TENSORBOARD = "tensorboard"  # the ladder's per-run scalars: results, moved aside with the rest by --fresh
LOCK = ".lock"  # held (flock) by the one job running in a results folder
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


def writable_folder(path: str | Path, name: str, create: bool = True) -> Path:
    """``path`` as a folder made (with its parents) and proven writable by creating a file in it; a ResultsError
    naming it (``name``: the flag, such as --out) otherwise, before any run starts. ``create=False`` proves the
    same without making anything (the nearest existing folder above it must be writable), so that a command
    refused later leaves no empty folder behind."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ResultsError(f"{name} {folder} is a file, not a folder")
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(existing))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        blocking = next((p for p in folder.parents if p.exists() and not p.is_dir()), None)
        reason = f"{blocking} is a file" if blocking is not None else exc.strerror or str(exc)
        raise ResultsError(f"{name} {folder}: cannot write there ({reason})") from None
    return folder


def make_folders(folder: Path) -> list[Path]:
    """Makes ``folder`` and its missing parents; returns those it made, deepest first (``remove_if_empty``)."""
    missing = [p for p in (folder.absolute(), *folder.absolute().parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def remove_if_empty(made: list[Path]) -> None:
    """Removes the folders ``make_folders`` made, deepest first, while they are empty: a command that stopped
    before writing anything leaves no empty results folder behind."""
    for path in made:
        try:
            path.rmdir()
        except OSError:
            return


@contextmanager
def folder_lock(folder: Path, command: str, other: str) -> Iterator[Path]:
    """One folder, one running job: an exclusive flock on ``folder/.lock``, holding this process's pid, for as
    long as the block runs. A second job is refused by name (the pid and command of the holder; ``other`` says
    what to give instead, such as "another --name"). The kernel drops an flock when its process dies, so the lock
    of a dead job (SIGKILL, a crash) is taken over, with a warning. The folder is made here, once the command has
    been validated, and removed again if the job wrote nothing in it."""
    made = make_folders(folder)
    path = folder / LOCK
    try:
        fd = _take_lock(path, folder, command, other)
    except BaseException:
        remove_if_empty(made)
        raise
    try:
        yield path
    finally:
        with suppress(OSError):
            path.unlink()  # unlinked while held: a waiting opener sees a new inode and tries again
        os.close(fd)
        remove_if_empty(made)


def _take_lock(path: Path, folder: Path, command: str, other: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _read_holder(path) or "a process that has not written its pid yet"
            raise ResultsError(f"{folder} is in use by another twinrun job ({holder}): one folder, one running "
                               f"job; wait for it to end, or give {other}") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a lock file its holder removed between our open and our flock
            break
        os.close(fd)
    stale = os.read(fd, 4096).decode(errors="replace").strip()
    if stale:
        warn(f"{path}: the lock of a job that ended without releasing it ({stale}) is taken over")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, twinrun {command}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    return fd


def _read_holder(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def run_settings(config: dict[str, Any], host: dict[str, Any], options: dict[str, Any] | None = None) -> Row:
    """What a measurement depends on beyond its key: the run's config, the host's versions and device, and the
    command's own options (inference calls, ...)."""
    settings: Row = {"config": {k: v for k, v in config.items() if k not in NOT_SETTINGS},
                     "host": {k: host[k] for k in HOST_SETTINGS if k in host}}
    if isinstance(config.get("data"), str):  # one data set, however its path was written (rows before it was absolute)
        settings["config"]["data"] = os.path.abspath(config["data"])
    if options:
        settings["options"] = options
    return settings


def row_settings(row: Row) -> Row:
    return run_settings(row.get("config") or {}, row.get("host") or {}, row.get("options"))


def changed_settings(old: Row, new: Row) -> list[str]:
    """'config.steps: 3 -> 7' for each setting that differs. A config field one side did not record (a row written
    before the knob existed) is read as its default, which that run had; another setting the old row did not record
    is not compared: nothing says it differed."""
    flat_old, flat_new = _flatten(old), _flatten(new)
    defaults = {f"config.{f.name}": f.default for f in dataclasses.fields(RunConfig)}
    for mine, theirs in ((flat_old, flat_new), (flat_new, flat_old)):
        for name in set(theirs) - set(mine):
            if name in defaults:
                mine[name] = defaults[name]
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
        self.pending = self.folder / PENDING
        self._export_checked = False

    def exists(self) -> bool:
        return self.path.exists() or self.jsonl.exists()

    # -- reading ----------------------------------------------------------------------------------------------

    def rows(self) -> list[Row]:
        """Every readable row, oldest first (rows still waiting in a pending file included); an unreadable record
        is skipped with a warning (and kept aside). Reading opens the database read-only: a folder the user may
        not write is read all the same."""
        if not self.path.exists():
            if not self.jsonl.exists():
                return _merged([], self._pending_rows())
            try:
                self._open().close()  # a folder from before the store: import its runs.jsonl
            except (OSError, ResultsError, sqlite3.Error):
                rows = [row for row, _ in _parse_lines(self.jsonl, warn_bad=True)]  # read-only: in memory
                return _merged(rows, self._pending_rows())
        try:
            with closing(self._reader()) as db:
                stored = db.execute("SELECT key, row FROM rows ORDER BY rowid").fetchall()
                self._check_export(db)
        except sqlite3.Error as exc:
            raise self._unreadable(exc) from None
        rows = []
        for key, text in stored:
            try:
                rows.append(json.loads(text))
            except json.JSONDecodeError as exc:
                warn(f"{self.path}: the record of key {key!r} is not valid JSON ({exc}); skipped")
        return _merged(rows, self._pending_rows())

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

    def check_resumable(self, planned: dict[str, Row], other: str = "another --name") -> None:
        """Refuses to go on with planned keys (key -> ``run_settings`` of the new run) whose finished rows were
        measured with other settings (another ``--steps``, ``--devices``, library version or device): they would
        be presented as this command's results. ``other``: the command's own way to a new folder."""
        finished = self.finished()
        clashes = [(key, changed) for key, settings in planned.items() if key in finished
                   if (changed := changed_settings(row_settings(finished[key]), settings))]
        if clashes:
            key, changed = clashes[0]
            more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
            raise ResultsError(f"{self.folder} holds finished runs measured with other settings, e.g. {key}{more}: "
                               f"{'; '.join(changed[:6])}. Rerun with --fresh to move the old results to "
                               f"{self.folder / OLD}/ and start over, or give {other}.")

    def start(self, planned: dict[str, Row], fresh: bool, other: str = "another --name") -> Path | None:
        """The start of a command that writes ``planned`` keys (key -> ``run_settings``), once every argument has
        been checked: rows a full disk left pending are imported first; with ``fresh``, the earlier results are
        moved aside (returns where to); otherwise rows of other settings are refused (``check_resumable``)."""
        self.import_pending()
        if fresh:
            return self.move_aside()
        self.check_resumable(planned, other)
        return None

    def locked(self, command: str, other: str) -> AbstractContextManager[Path]:
        """This folder's lock for the block (``folder_lock``): one running job per results folder."""
        return folder_lock(self.folder, command, other)

    # -- writing ----------------------------------------------------------------------------------------------

    def add(self, row: Row) -> bool:
        """Stores ``row``; False if an earlier finished row of its key was kept instead of this unfinished one."""
        return not self.add_many([row])

    def add_many(self, new_rows: Iterable[Row]) -> list[Row]:
        """Stores the rows in one transaction; returns the new rows that were not stored because an earlier
        finished row of the same key was kept. Rows the database cannot take (a full disk, a damaged file) are
        kept in a pending file and a ResultsError says where, in one line: the next write imports them."""
        rows = list(new_rows)
        try:
            self.import_pending()
            kept_old = self._insert(rows)
        except (sqlite3.Error, OSError, ResultsError) as exc:
            raise self._kept_pending(rows, exc) from None
        try:
            self.export()
        except (sqlite3.Error, OSError) as exc:
            raise ResultsError(f"{self.path}: the rows are stored, but the exports {', '.join(EXPORTS)} could not be "
                               f"rewritten ({_reason(exc)}); the next write or report rewrites them") from None
        return kept_old

    def _insert(self, rows: list[Row]) -> list[Row]:
        kept_old = []
        with self._writing() as db:
            for row in rows:
                old = db.execute("SELECT status FROM rows WHERE key = ?", (row["key"],)).fetchone()
                if old and old[0] in FINISHED and row.get("status") not in FINISHED:
                    kept_old.append(row)
                    continue
                db.execute("INSERT OR REPLACE INTO rows (key, status, written, row) VALUES (?, ?, ?, ?)",
                           (row["key"], row.get("status"), time.time(), json.dumps(row, sort_keys=True, default=str)))
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

    # -- rows a full disk left pending --------------------------------------------------------------------------

    def pending_files(self) -> list[Path]:
        """Where rows the store could not take are kept: beside it, or (when even that could not be written) in
        the user's cache folder or the temporary folder, under a name made from this folder's absolute path."""
        tag = hashlib.sha256(str(self.folder.absolute()).encode()).hexdigest()[:16]
        name = f"twinrun-pending-{tag}.jsonl"
        home = os.environ.get("HOME")
        cache = [Path(home) / ".cache" / "twinrun" / name] if home else []
        return [self.pending, *cache, Path(tempfile.gettempdir()) / name]

    def _pending_rows(self) -> list[Row]:
        return [row for path in self.pending_files() if path.is_file() for row, _ in _parse_lines(path, True)]

    def import_pending(self) -> int:
        """Stores the rows a full disk left pending (a finished row is never replaced by an unfinished one), then
        removes the pending files; returns how many rows were imported."""
        files = [path for path in self.pending_files() if path.is_file()]
        rows = [row for path in files for row, _ in _parse_lines(path, warn_bad=True)]
        if rows:
            self._insert(rows)
            warn(f"{len(rows)} row(s) kept pending in {', '.join(map(str, files))} imported into {self.path}")
        for path in files:
            path.unlink(missing_ok=True)
        return len(rows)

    def _kept_pending(self, rows: list[Row], exc: BaseException) -> ResultsError:
        """``rows``, which the database could not take, appended to the first pending file that can be written;
        the one-line error that says why and where they are."""
        keys = ", ".join(str(row.get("key")) for row in rows[:3]) + (" ..." if len(rows) > 3 else "")
        text = "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in rows)
        failures = []
        for path in self.pending_files():
            existed = path.exists()
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as handle:
                    handle.write(text)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as error:
                failures.append(f"{path}: {error.strerror or error}")
                if not existed:  # made here, empty: nothing to leave behind
                    with suppress(OSError):
                        path.unlink()
                continue
            return ResultsError(f"{self.path}: could not store the row(s) of {keys} ({_reason(exc)}); kept in {path}; "
                                f"make room and run the same command again: it imports them first")
        return ResultsError(f"{self.path}: could not store the row(s) of {keys} ({_reason(exc)}), nor keep them "
                            f"anywhere ({'; '.join(failures)}); make room and run the same command again to redo them")

    # -- the folder ---------------------------------------------------------------------------------------------

    def move_aside(self) -> Path | None:
        """Moves the folder's results (store, exports, report, plots and TensorBoard scalars) to ``old/<time>/`` in
        the same folder, for ``--fresh``: nothing is deleted. Returns where they went (None: there was nothing)."""
        if self.path.exists():
            try:
                with closing(self._open()) as db:
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:  # a damaged store moves aside as it is, with its -wal and -shm files
                warn(f"{self.path}: {_reason(exc)}; moved aside as it is")
        names = [DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm", *EXPORTS, REJECTED, "report.md", TENSORBOARD]
        moving = [self.folder / n for n in names if (self.folder / n).exists()]
        moving += sorted(self.folder.glob("*.png")) + sorted(self.folder.glob(f"{EXPORTS[0]}.edited-*"))
        if not moving:
            return None
        target = self._old_folder()
        for path in moving:
            os.replace(path, target / path.name)
        return target

    def keep_aside(self, path: Path) -> Path:
        """Moves ``path`` (inside this folder) to ``old/<time>/`` under the same relative path: for files a new
        attempt would otherwise overwrite without a row that says they may go (nothing is deleted)."""
        try:
            relative = path.absolute().relative_to(self.folder.absolute())
        except ValueError:
            relative = Path(path.name)
        target = self._old_folder() / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        return target

    def _old_folder(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = self.folder / OLD / stamp, 1
        while target.exists():
            target, n = self.folder / OLD / f"{stamp}-{n}", n + 1
        target.mkdir(parents=True)
        return target

    def check_writable(self) -> None:
        """A clear error now, not a traceback after the first run, if results cannot be written here (nothing is
        made yet: a command refused later leaves no empty folder)."""
        writable_folder(self.folder, "results folder", create=False)

    # -- the database -----------------------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        """A read-only connection to the existing database. A folder this user cannot write cannot hold WAL's
        shared-memory file: then the file is read as it is on disk (``immutable``; nobody can be writing it
        through this folder either)."""
        uri = f"file:{urllib.parse.quote(str(self.path.absolute()))}?mode=ro"
        db = sqlite3.connect(uri, uri=True, timeout=120.0, isolation_level=None)
        try:
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return db
        except sqlite3.OperationalError:
            db.close()
            if _writable(self.folder):
                raise
        except BaseException:
            db.close()
            raise
        return sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None)

    def _unreadable(self, exc: sqlite3.Error) -> ResultsError:
        """The one-line error for a database that cannot be read: a damaged one is kept, with the way back."""
        if not _damaged(exc):
            return ResultsError(f"{self.path}: cannot read the store ({_reason(exc)})")
        export = (f"then run the command again: it imports {self.jsonl}, the export of its rows" if self.jsonl.exists()
                  else f"there is no {self.jsonl.name} export here to recover its rows from")
        return ResultsError(f"{self.path} is not a twinrun store or is damaged ({exc}); it is left as it is. To go "
                            f"on: mv {self.path} {self.path}.damaged (with any -wal/-shm files beside it), {export}")

    def _open(self) -> sqlite3.Connection:
        """A connection in autocommit mode (transactions are explicit), creating the database if needed and
        importing a runs.jsonl written before it."""
        created = not self.path.exists()
        if created:
            writable_folder(self.folder, "results folder")
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
            except sqlite3.DatabaseError as exc:
                db.close()
                raise self._unreadable(exc) from None
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


def _writable(folder: Path) -> bool:
    """Whether a file can be made in ``folder`` (os.access says yes to root on a read-only mount)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _merged(rows: list[Row], pending: list[Row]) -> list[Row]:
    """``rows`` with the pending ones added by key, as the store would take them: a finished row is never replaced
    by an unfinished one."""
    if not pending:
        return rows
    by_key = {row["key"]: row for row in rows}
    for row in pending:
        old = by_key.get(row["key"])
        if old is None or old.get("status") not in FINISHED or row.get("status") in FINISHED:
            by_key[row["key"]] = row
    return list(by_key.values())


def _damaged(exc: BaseException) -> bool:
    """Whether sqlite says the file is not a database or is corrupt (rather than locked, full or unreadable)."""
    name = getattr(exc, "sqlite_errorname", "")
    return name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or any(
        text in str(exc) for text in ("not a database", "malformed"))


def _reason(exc: BaseException) -> str:
    """An error's reason in a few words (an OSError's strerror; sqlite's own message)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


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
