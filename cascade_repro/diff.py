"""Two run records → what differs, section by section, ordered by what matters for reproduction.

Pure: manifests (and an optional `git diff --stat` text) in, a frozen `Diff` out. The record's
sections come from the one comparator (`determinism.record_compare`), which `verify`, `check` and
restore read as well; each change has its fingerprint class (docs/architecture.md): A (bitwise
equality impossible), B (a likely root cause), C (informational). Results (metrics, checkpoints,
the trace) are added here and come last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from cascade_repro.determinism import record_compare
from cascade_repro.determinism.catalogue import lookup
from cascade_repro.determinism.record_compare import CLASS_ORDER, MISSING, Change, Section, compare_records
from cascade_repro.manifest import Manifest

RECORD_SECTIONS = record_compare.SECTIONS
SECTIONS = (*RECORD_SECTIONS, "metrics", "checkpoints", "trace")
__all__ = ["SECTIONS", "Change", "Diff", "Section", "diff_records"]


@dataclass(frozen=True)
class Diff:
    """What differs between two runs, section by section (`cascade diff`)."""

    run_a: str
    run_b: str
    experiments: tuple[str, str]
    sections: tuple[Section, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def identical(self) -> bool:
        return not any(s.changes for s in self.sections)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "cascade.diff/1",
            "run_a": self.run_a,
            "run_b": self.run_b,
            "experiments": list(self.experiments),
            "notes": list(self.notes),
            "sections": [s.to_dict() for s in self.sections],
        }


def diff_records(a: Manifest, b: Manifest, only: tuple[str, ...] = (),
                 code_stat: str | None = None, trace_note: str | None = None,
                 latest: tuple[Mapping[str, float], Mapping[str, float]] = ({}, {})) -> Diff:  # fmt: skip
    """`only`: section names to keep (all when empty). `code_stat`: `git diff --stat` between the
    commits, computed by the caller (this module runs nothing). `latest`: each run's metrics as the
    store holds them (their last values): those the script logged to MLflow itself (a framework's
    logger) are in no record's summary."""
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; sections: {', '.join(SECTIONS)}")
    record_only = tuple(name for name in only if name in RECORD_SECTIONS)
    sections = [] if only and not record_only else list(compare_records(a, b, record_only).sections)
    code = next((i for i, s in enumerate(sections) if s.name == "code"), None)
    if code is not None:
        sections[code] = _with_stat(sections[code], code_stat)
    results: dict[str, Callable[[], Section]] = {
        "metrics": lambda: _metrics(a, b, latest),
        "checkpoints": lambda: _mapping("checkpoints", _checkpoints(a), _checkpoints(b)),
        "trace": lambda: _trace(trace_note),
    }
    sections += [build() for name, build in results.items() if not only or name in only]
    sections.sort(key=lambda s: (CLASS_ORDER[s.klass] if s.changes else 9, SECTIONS.index(s.name)))
    experiments = (a.experiment, b.experiment)
    notes = []
    if experiments[0] != experiments[1]:
        notes.append(f"the runs belong to different experiments: {experiments[0]} and {experiments[1]}")
    return Diff(a.run_id, b.run_id, experiments, tuple(sections), tuple(notes))


def _mapping(name: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> Section:
    changes, equal = [], 0
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, MISSING), b.get(key, MISSING)
        if va == vb:
            equal += 1
            continue
        note = "added" if key not in a else "removed" if key not in b else None
        changes.append(Change(key, va, vb, lookup(name, key).klass, note))
    return Section(name, tuple(changes), equal)


def _with_stat(section: Section, stat: str | None) -> Section:
    """The code section with the `git diff --stat` between the commits as the commit's note."""
    if not stat or not any(c.key == "commit" for c in section.changes):
        return section
    changes = tuple(
        Change(c.key, c.a, c.b, c.klass, stat.strip(), c.kind) if c.key == "commit" else c
        for c in section.changes
    )
    return Section(section.name, changes, section.equal)


def _metrics(a: Manifest, b: Manifest, latest: tuple[Mapping[str, float], Mapping[str, float]]) -> Section:
    def view(m: Manifest, stored: Mapping[str, float]) -> dict[str, Any]:
        keys = m.metrics.get("keys") or {}
        out = {}
        for key, stats in keys.items():
            if key.startswith("cascade.") or not isinstance(stats, Mapping):
                continue
            out[f"{key} (last)"] = stats.get("last")
            out[f"{key} (min)"] = stats.get("min")
        for key, value in stored.items():  # logged past cascade's writer: the store's last value only
            if not key.startswith("cascade.") and key not in keys:
                out[f"{key} (last)"] = value
        return out

    views = (view(a, latest[0]), view(b, latest[1]))
    if not all(views):
        return Section("metrics", (), 0)  # `current`, or a run that logged nothing: nothing to compare
    section = _mapping("metrics", *views)
    changes = tuple(
        Change(c.key, c.a, c.b, c.klass, f"Δ {c.b - c.a:+.4g}")
        if isinstance(c.a, (int, float)) and isinstance(c.b, (int, float))
        else c
        for c in section.changes
    )
    return Section("metrics", changes, section.equal)


def _checkpoints(m: Manifest) -> dict[str, Any]:
    return {c.path: c.md5 for c in m.checkpoints if c.status == "kept"}


def _trace(note: str | None) -> Section:
    if note is None:
        return Section("trace", (), 0)
    if note.startswith(("BITWISE_IDENTICAL", "all ")):
        return Section("trace", (), 1)
    return Section(
        "trace", (Change("first divergence", None, None, lookup("trace", "first divergence").klass, note),), 0
    )
