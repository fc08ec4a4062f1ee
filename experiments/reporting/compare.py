"""Two results folders side by side (``twinrun compare A B``), as pyperf's compare_to and criterion's saved baselines
do for code: before and after a library upgrade, on two machines, at two commits. Configurations are matched by
their rung or sweep value and framework (inference rows: by framework and variant); each matched pair gets B's time
against A's, with its 95% interval and a verdict, judged against the larger of the two folders' noise floors.

What is being compared (the host: library versions, CPU, GPUs) is listed once at the top. A configuration whose
run settings differ beyond that (another --steps, batch size, preset ...) is named with each difference and not
matched, unless the user says that difference is part of the comparison (``ignore``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.execution.record import RunRecord
from experiments.execution.store import ResultsError, ResultStore, changed_settings, run_settings
from experiments.reporting.analysis import Analysis, analyse
from experiments.reporting.cells import Cells, ladder_cells, ordered_groups, sweep_cells
from experiments.reporting.stats import NO_DIFFERENCE, Comparison, bootstrap_ratio, compare, judge
from experiments.reporting.tables import step_text


@dataclass(frozen=True)
class Side:
    """One folder's configurations, their estimates and floors."""

    folder: Path
    cells: Cells
    analysis: Analysis
    infer: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (framework, variant) -> row


@dataclass(frozen=True)
class Matched:
    configuration: tuple[str, str]
    comparison: Comparison
    a: str  # A's value, in words
    b: str


@dataclass(frozen=True)
class Comparing:
    """What ``compare_folders`` found: the host differences (what is being compared), the matched configurations,
    and those left unmatched with why."""

    host_changes: list[str]
    matched: list[Matched]
    unmatched: list[str]


def load(folder: Path) -> Side:
    store = ResultStore(folder)
    if not store.exists():
        raise ResultsError(f"{folder}: no results here (no runs.sqlite or runs.jsonl)")
    records = [r for r in store.records() if r.command in ("ladder", "sweep")]
    infer = {(row["framework"], row["variant"]): row for row in store.rows() if row.get("command") == "infer"}
    if not records and not infer:
        raise ResultsError(f"{folder}: no ladder, sweep or inference rows to compare")
    cells = sweep_cells(records) if any(r.command == "sweep" for r in records) else ladder_cells(records)
    return Side(folder, cells, analyse(cells, []), infer)


def _settings(record: RunRecord) -> dict[str, Any]:
    return run_settings(record.config, record.host)


def _split(changes: list[str]) -> tuple[list[str], list[str]]:
    """(host changes, other changes) of ``changed_settings``' lines."""
    host = [c for c in changes if c.startswith("host.")]
    return host, [c for c in changes if not c.startswith("host.")]


def compare_folders(a: Side, b: Side, ignore: Iterable[str] = ()) -> Comparing:
    """B against A, configuration by configuration (see the module's docstring)."""
    ignored = tuple(ignore)
    host_changes: set[str] = set()
    matched, unmatched = [], []
    groups = ordered_groups({**a.cells, **b.cells})
    for group in groups:
        for framework in ("torch", "jax"):
            key = (group, framework)
            if key not in a.cells or key not in b.cells:
                if key in a.cells or key in b.cells:
                    unmatched.append(f"{group} {framework}: only in {'A' if key in a.cells else 'B'}")
                continue
            ca, cb = a.cells[key].example, b.cells[key].example
            if ca is None or cb is None:
                unmatched.append(f"{group} {framework}: no finished run in {'A' if ca is None else 'B'}")
                continue
            host, other = _split(changed_settings(_settings(ca), _settings(cb)))
            host_changes.update(host)
            other = [c for c in other if not c.split(":")[0].startswith(ignored)] if ignored else other
            if other:
                unmatched.append(f"{group} {framework}: settings differ beyond the host: {'; '.join(other[:4])}")
                continue
            ea, eb = a.analysis.estimates[key], b.analysis.estimates[key]
            floor = max(a.analysis.floors.get(framework, 0.0), b.analysis.floors.get(framework, 0.0))
            matched.append(Matched(key, compare(ea, eb, floor), step_text(ea), step_text(eb)))
    matched += _inference(a, b, unmatched, host_changes, ignored)
    return Comparing(sorted(host_changes), matched, unmatched)


def _inference(a: Side, b: Side, unmatched: list[str], host_changes: set[str],
               ignored: tuple[str, ...]) -> list[Matched]:
    """Inference variants: B's batch-1 p50 latency against A's, a bootstrap over both processes' calls (one process
    each: the interval is within those two processes)."""
    matched = []
    for key in sorted(set(a.infer) | set(b.infer)):
        ra, rb = a.infer.get(key), b.infer.get(key)
        name = f"{key[1]} {key[0]}"
        if ra is None or rb is None or ra.get("status") != "ok" or rb.get("status") != "ok":
            unmatched.append(f"{name}: not measured (ok) in both")
            continue
        host, other = _split(changed_settings(run_settings(ra.get("config") or {}, ra.get("host") or {},
                                                           ra.get("options")),
                                              run_settings(rb.get("config") or {}, rb.get("host") or {},
                                                           rb.get("options"))))
        host_changes.update(host)
        other = [c for c in other if not c.split(":")[0].startswith(ignored)] if ignored else other
        if other:
            unmatched.append(f"{name}: settings differ beyond the host: {'; '.join(other[:4])}")
            continue
        samples_a, samples_b = _latency_samples(ra), _latency_samples(rb)
        if samples_a and samples_b:
            ratio, lo, hi = bootstrap_ratio(samples_a, samples_b)
            comparison = judge(ratio, lo, hi, why="within the two processes")
        else:
            ratio = rb["latency_b1_ms"]["p50"] / ra["latency_b1_ms"]["p50"]
            comparison = judge(ratio, math.nan, math.nan, why="rows without their call samples: no interval")
        matched.append(Matched((key[1], key[0]), comparison, f"{ra['latency_b1_ms']['p50']:.2f} ms p50",
                               f"{rb['latency_b1_ms']['p50']:.2f} ms p50"))
    return matched


def _latency_samples(row: dict[str, Any]) -> list[float]:
    return list(row.get("latency_b1_ms", {}).get("samples") or [])


def markdown(a: Side, b: Side, found: Comparing) -> str:
    """The comparison as markdown: what differs between the hosts, one row per matched configuration, and the
    unmatched ones with why."""
    rows = ["| configuration | framework | A | B | B / A [95% CI] | verdict |", "|---|---|---|---|---|---|"]
    for m in found.matched:
        c = m.comparison
        ratio = f"{c.ratio:.3f}" + (f" [{c.lo:.3f}, {c.hi:.3f}]" if math.isfinite(c.lo) else "")
        rows.append(f"| {m.configuration[0]} | {m.configuration[1]} | {m.a} | {m.b} | {ratio} | {c.text()} |")
    decided = [m for m in found.matched if m.comparison.verdict != NO_DIFFERENCE]
    floors = [f"{side}: " + (", ".join(f"{fw} {100 * (math.exp(f) - 1):.1f}%" for fw, f in s.analysis.floors.items())
                             or "no A/A control") for side, s in (("A", a), ("B", b))]
    parts = [f"# twinrun compare: B = {b.folder} against A = {a.folder}",
             "What is being compared (A -> B): " + ("; ".join(found.host_changes) or
                                                   "nothing in the recorded host (the same versions, CPU and GPUs: "
                                                   "two commits, or two days)"),
             "Each configuration: B's time against A's (below 1: B is faster), the 95% interval of the ratio (runs "
             "are the unit of replication; each folder's spread pooled per framework; inference: a bootstrap over "
             "the calls of the two processes), judged against the larger of the two folders' A/A noise floors ("
             + "; ".join(floors) + ").",
             "\n".join(rows),
             f"{len(found.matched)} configurations matched, {len(decided)} with a detectable change."]
    if found.unmatched:
        parts.append("Not matched:\n\n" + "\n".join(f"- {u}" for u in found.unmatched))
    return "\n\n".join(parts) + "\n"
