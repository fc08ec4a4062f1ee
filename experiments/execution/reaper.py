"""The driver's workers die with it: ``python -m experiments.execution.reaper`` (standard library only).

The driver starts every worker in a session (and process group) of its own, so that the terminal's Ctrl-C reaches
only the driver, which then stops its workers itself (runner._run_all). Nothing of a job may outlive the driver on
any other exit path either, SIGKILL included; ``prctl(PR_SET_PDEATHSIG)`` would kill only the direct child, and a
Python handler in a worker may not run for minutes (an XLA compile). So each driver process starts, on first use,
one reaper: a plain process in a session of its own (out of reach of a signal to the driver's group), whose stdin
is a pipe from the driver. The driver writes registrations and releases into it, one a line::

    +group PGID     -group PGID     +folder PATH     -folder PATH

When the pipe reaches end-of-file (the driver exited or died, whichever way), the reaper kills what is still
registered (``kill_job``: the groups, every process that carries a registered folder in its environment, and their
descendants), removes the folders that are still registered, and exits.

Every process a job execs carries ``TWINRUN_JOB_FOLDER=<its folder>`` in its environment; that also finds the
processes that leave the job's group (torchrun starts each of its workers in a session of its own), and a worker
the driver had started but not yet registered (its folder is registered first). A run forked by a zygote
(execution/zygote.py) is not found that way (/proc shows the environment a process was exec'd with, the zygote's):
it leads its own session before the driver hears of it, and is killed by its group and its descendants. POSIX
only: elsewhere ``lifeline`` is a no-op and nothing here runs.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

# Set in the environment of every process a job starts (and inherited by theirs): the job's folder.
MARKER = "TWINRUN_JOB_FOLDER"
# A job folder: tempfile.mkdtemp(prefix=f"twinrun-{driver pid}-") -- its random part is 8 of [a-z0-9_].
FOLDER_PREFIX = "twinrun-{pid}-"
_JOB_FOLDER = re.compile(r"twinrun-([0-9]+)-[a-z0-9_]{8}")


def job_folder_prefix() -> str:
    return FOLDER_PREFIX.format(pid=os.getpid())


# -- killing a job: its process groups, its marked processes and their descendants --------------------------------

def _processes(folders: Iterable[str]) -> list[tuple[int, int, int, bool]]:
    """(pid, parent pid, process group, carries a folder's marker) of every process this user can see."""
    markers = {os.fsencode(f"{MARKER}={folder}") for folder in folders}
    if os.path.isdir("/proc/self"):
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    stat = handle.read()
                state, ppid, pgid = stat[stat.rindex(b")") + 2:].split()[:3]
            except (OSError, ValueError):
                continue  # gone meanwhile
            marked = False
            if markers and state != b"Z":
                with contextlib.suppress(OSError):  # another user's process, or gone
                    with open(f"/proc/{name}/environ", "rb") as handle:
                        marked = not markers.isdisjoint(handle.read().split(b"\0"))
            found.append((int(name), int(ppid), int(pgid), marked))
        return found
    try:  # no /proc (macOS, BSD): no environments either, the groups and their descendants only
        listing = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "pgid="], capture_output=True,
                                 text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = (line.split() for line in listing.splitlines())
    return [(int(row[0]), int(row[1]), int(row[2]), False) for row in rows if len(row) == 3]


def _signal(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


def kill_job(groups: Iterable[int], folders: Iterable[str] = ()) -> None:
    """SIGKILLs every process in ``groups``, every process whose environment names one of ``folders`` as its job
    folder, and all their descendants (DataLoader / grain workers, inductor compile workers, torchrun's workers).
    They are stopped first (SIGSTOP), so that none forks, or loses its parent link, while the set is collected.
    SIGINT, SIGTERM and SIGHUP wait until it is done (a second Ctrl-C would otherwise leave them stopped)."""
    if os.name != "posix":
        return
    with _signals_held():
        _kill_job(groups, folders)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Holds SIGINT, SIGTERM and SIGHUP (their Python handlers run in the main thread only) until the block ends,
    then delivers them to the handlers they had."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(sig)
        if handler is not None:  # None: set outside Python, which could not be put back
            previous[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in caught:
            signal.raise_signal(sig)


def _kill_job(groups: Iterable[int], folders: Iterable[str]) -> None:
    me, mine = os.getpid(), os.getpgrp()
    folders = [str(folder) for folder in folders]
    groups = {group for group in groups if group > 1 and group != mine}
    doomed: set[int] = set()
    try:
        for group in groups:
            _signal(group, signal.SIGSTOP, group=True)
        for _ in range(100):  # until a look finds nothing new: then nothing of it is left running to fork
            new = {(pid, pgid) for pid, ppid, pgid, marked in _processes(folders)
                   if pid not in doomed and pid != me and pid > 1 and (pgid in groups or ppid in doomed or marked)}
            if not new:
                break
            for pid, _ in new:
                _signal(pid, signal.SIGSTOP)
            doomed |= {pid for pid, _ in new}
            groups |= {pid for pid, pgid in new if pid == pgid != mine}  # a leader's group goes with it
    finally:
        for group in groups:
            _signal(group, signal.SIGKILL, group=True)
        for pid in doomed:
            _signal(pid, signal.SIGKILL)


# -- stale folders: a second net for a driver that died before its reaper could clean up ---------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_folders(parent: str | None = None) -> list[Path]:
    """Removes the job folders (``twinrun-<pid>-xxxxxxxx``, exactly, this user's) in the temporary directory whose
    driver process is gone; returns them."""
    parent = parent or tempfile.gettempdir()
    removed: list[Path] = []
    if os.name != "posix":
        return removed
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = _JOB_FOLDER.fullmatch(entry.name)
        if match is None or int(match[1]) == os.getpid():
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not _alive(int(match[1])):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


# -- the driver's side: one reaper per driver process, started on first use ----------------------------------------

class Lifeline:
    """The driver's pipe to its reaper. Registrations are kept here too: a reaper that died (killed by hand) is
    started again and told them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: dict[str, None] = {}  # the registrations in force, in order
        self._orphaned: list[subprocess.Popen[bytes]] = []  # a forked child's copies (kept from Popen.__del__)

    def add_group(self, pgid: int) -> None:
        self._send("+", f"group {pgid}")

    def drop_group(self, pgid: int) -> None:
        self._send("-", f"group {pgid}")

    def add_folder(self, path: str | os.PathLike[str]) -> None:
        self._send("+", f"folder {os.fspath(path)}")

    def drop_folder(self, path: str | os.PathLike[str]) -> None:
        self._send("-", f"folder {os.fspath(path)}")

    def close(self, timeout_s: float = 10.0) -> None:
        """End of the driver: the reaper sees end-of-file, cleans up what is left and exits (waited for)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout_s)

    def _send(self, sign: str, registration: str) -> None:
        if os.name != "posix" or "\n" in registration:
            return
        with self._lock:
            if sign == "+":
                self._lines[registration] = None
            else:
                self._lines.pop(registration, None)
            line = f"{sign}{registration}\n"
            try:
                self._write(line)
            except OSError:  # the reaper is gone: a new one, told everything in force
                self._proc = None
                if sign == "-":  # a release never fails a clean-up (nor does it need a reaper)
                    with contextlib.suppress(OSError):
                        self._write(line)
                    return
                self._write(line)

    def _write(self, line: str) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                          stdout=subprocess.DEVNULL, start_new_session=True)
            self._proc.stdin.write(os.fsencode("".join(f"+{r}\n" for r in self._lines)))  # type: ignore[union-attr]
        self._proc.stdin.write(os.fsencode(line))  # type: ignore[union-attr]
        self._proc.stdin.flush()  # type: ignore[union-attr]

    def _after_fork_in_child(self) -> None:
        """A forked child must not hold the driver's pipe open (the reaper would wait for it too)."""
        self._lock = threading.Lock()
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()  # type: ignore[union-attr]
            self._orphaned.append(self._proc)
            self._proc = None
        self._lines = {}


_LIFELINE = Lifeline()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_LIFELINE._after_fork_in_child)
atexit.register(_LIFELINE.close)


def lifeline() -> Lifeline:
    """This process's lifeline (its reaper starts with the first registration)."""
    return _LIFELINE


# -- the reaper process -------------------------------------------------------------------------------------------

def serve(stream) -> None:  # noqa: ANN001 -- a binary file
    """Reads registrations until end-of-file, then kills and removes what is still registered."""
    groups: dict[int, None] = {}
    folders: dict[str, None] = {}
    for raw in stream:
        if not raw.endswith(b"\n"):
            break  # a line cut short: the driver died while writing it
        head, _, value = os.fsdecode(raw[:-1]).partition(" ")
        table: dict
        if head[1:] == "group" and value.isdigit():
            table, key = groups, int(value)
        elif head[1:] == "folder" and value:
            table, key = folders, value
        else:
            continue
        if head[0] == "+":
            table[key] = None
        elif head[0] == "-":
            table.pop(key, None)
    kill_job(groups, folders)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    for name in ("SIGINT", "SIGHUP", "SIGTERM"):  # its work is at end-of-file; only SIGKILL stops it early
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    serve(sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
