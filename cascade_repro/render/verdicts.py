"""What `verify`, `diff` and `check` print: verdicts, causes and differences by class."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

from cascade_repro.determinism.catalogue import shown
from cascade_repro.render.console import _cell, _console, _styled, one_line

if TYPE_CHECKING:
    from cascade_repro.check import CheckReport
    from cascade_repro.determinism.verdict import Verdict
    from cascade_repro.diff import Diff


MAGNITUDES_SHOWN = 12  # tensors measured by --replay, one line each


def verdict(result: Verdict) -> None:
    """`cascade verify`: the verdict, each rank's, the first divergence, the likely causes."""
    console = _console()
    style = "green" if result.reproduced else "red"
    console.print(_styled((result.verdict, f"bold {style}"), f"  {result.run_a[:12]} → {result.run_b[:12]}"))
    console.print(f"  {result.summary}")
    for rank in result.ranks:
        console.print(f"  rank {rank.rank}: {rank.verdict} ({rank.steps} steps compared)")
    _first_divergence(console, result)
    _replay(console, result.replay)
    if result.causes:
        console.print("  Likely causes, most likely first:")
        for index, cause in enumerate(result.causes, 1):
            console.print(f"    {index}. {one_line(cause.summary)}")  # (they quote the records' names)
            console.print(f"       evidence: {one_line(cause.evidence)}")
            console.print(f"       fix: {one_line(cause.fix)}")
    for record_difference in result.differences:
        if not any(record_difference.summary == cause.summary for cause in result.causes):
            summary = one_line(record_difference.summary)
            console.print(f"  also differs (class {record_difference.klass}): {summary}")
    for note in result.comparison.notes:
        console.print(f"  note: {one_line(note)}")


def _first_divergence(console: Any, result: Verdict) -> None:
    """The facets that differ at the first divergent step, and the tensors --replay measured there."""
    c = result.comparison
    if c.step is None:
        return
    for difference in c.differences:
        names = f" {one_line(', '.join(difference.names[:6]))}" if difference.names else ""
        console.print(f"  step {c.step} · {difference.facet}:{names} ({difference.detail})")
    for magnitude in result.magnitudes[:MAGNITUDES_SHOWN]:
        console.print(f"  step {c.step} · {magnitude.facet} {one_line(magnitude.name)}: {magnitude.detail}")
    if len(result.magnitudes) > MAGNITUDES_SHOWN:  # (a step where every tensor differs: a model's worth)
        console.print(f"  step {c.step} · … and {len(result.magnitudes) - MAGNITUDES_SHOWN} more tensors "
                      "measured (--json lists every one)")  # fmt: skip


def _replay(console: Any, replay: Mapping[str, Any] | None) -> None:
    """`verify --replay`: the runs it made, and what it could not measure."""
    if replay is None:
        return
    runs = replay.get("runs") or {}
    if runs:
        console.print("  replayed as runs " + ", ".join(f"{side}: {run[:12]}" for side, run in runs.items()))
    for reason in replay.get("not_measured") or []:
        console.print(f"  not measured: {reason}")


CLASS_WORDS = {"A": "class A · bitwise impossible", "B": "class B · likely cause", "C": "class C · info",
               "R": "results"}  # fmt: skip


def diff(result: Diff) -> None:
    """`cascade diff`: the sections that differ, most decisive class first, then what is equal."""
    from rich.table import Table

    console = _console()
    console.print(_styled((result.run_a[:12], "bold"), " → ", (result.run_b[:12], "bold")))
    for note in result.notes:
        console.print(f"  note: {note}")
    if result.identical:
        console.print("  no differences")
    for section in result.sections:
        if not section.changes:
            continue
        console.print(
            _styled("\n", (section.name, "bold"), f" ({CLASS_WORDS[section.klass]}; {section.equal} equal)")
        )
        table = Table(box=None, header_style="bold", show_header=True, pad_edge=False)
        for column in ("", "key", "A", "B", "note"):
            table.add_column(column, overflow="fold")
        for change in section.changes:
            a, b = _where_they_differ(*(shown(section.name, change.key, v) for v in (change.a, change.b)))
            table.add_row(change.klass, one_line(change.key), _cell(a), _cell(b), one_line(change.note or ""))
        console.print(table)
    same = [s.name for s in result.sections if not s.changes and s.equal]
    if same:
        console.print(f"\nequal: {', '.join(same)}")


def _where_they_differ(a: Any, b: Any) -> tuple[Any, Any]:
    """Two lists (a command's arguments) without the items they share at both ends, counted instead, so
    that a cell cut to its width still shows the difference (found on nanoGPT: an added
    --learning_rate=0.002 past the 60th character, both cells alike)."""
    if not (isinstance(a, list) and isinstance(b, list)) or a == b:
        return a, b
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    if not head and not tail:
        return a, b

    def cut(items: list[Any]) -> str:
        middle = [json.dumps(item, default=str) for item in items[head:len(items) - tail]]
        ends = ([f"…{head} same"] if head else []) + middle + ([f"{tail} same…"] if tail else [])
        return "[" + ", ".join(ends) + "]"

    return cut(a), cut(b)


def check_report(report: CheckReport) -> None:
    """`cascade check`: the verdict, then each finding with the fix."""
    console = _console()
    style = {"BITWISE_REPRODUCIBLE": "green", "OK": "green", "WITHIN_TOLERANCE_ONLY": "yellow"}.get(
        report.verdict, "red"
    )
    console.print(_styled((report.verdict, f"bold {style}"), f"  ({report.subject})"))
    marks = {"ok": "ok  ", "problem": "FAIL", "not_runnable": "STOP", "tolerance": "A   ",
             "restore_fixes": "B   "}  # fmt: skip
    for finding in report.findings:
        console.print(f"  {marks.get(finding.level, '    ')} {finding.summary}")
        if finding.fix:
            console.print(f"       fix: {finding.fix}")
