"""Two run records → what differs, section by section, ordered by what matters for reproduction.

Pure: manifests (and an optional `git diff --stat` text) in, a frozen `Diff` out. Each change has
the fingerprint class (docs/architecture.md): A (bitwise equality impossible), B (a likely root cause), C
(informational); results (metrics, checkpoints) come last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from cascade_repro.manifest import data_objects
from cascade_repro.params import flatten

SECTIONS = (
    "stack", "code", "params", "seed", "packages", "environment", "data", "container", "machine",
    "metrics", "checkpoints", "trace",
)  # fmt: skip
CLASS_ORDER = {"A": 0, "B": 1, "C": 2, "R": 3}  # R: results
TORCH_CLASS_A = (
    "version", "git_version", "cuda", "hip", "cudnn", "nccl", "cpu_capability", "mkl_version",
    "onednn_version", "debug", "cxx_abi",
)  # fmt: skip
MISSING = None
OWN_VARIABLES = ("CASCADE_", "MLFLOW_", "PYTHONHASHSEED")


@dataclass(frozen=True)
class Change:
    key: str
    a: Any
    b: Any
    klass: str  # A, B, C or R (results)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "a": self.a, "b": self.b, "class": self.klass, "note": self.note}


@dataclass(frozen=True)
class Section:
    name: str
    changes: tuple[Change, ...]
    equal: int  # how many compared items are the same

    @property
    def klass(self) -> str:
        return min((c.klass for c in self.changes), key=CLASS_ORDER.__getitem__, default="C")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "class": self.klass, "equal": self.equal,
                "changes": [c.to_dict() for c in self.changes]}  # fmt: skip


@dataclass(frozen=True)
class Diff:
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


def diff_records(a: Mapping[str, Any], b: Mapping[str, Any], only: tuple[str, ...] = (),
                 code_stat: str | None = None, trace_note: str | None = None) -> Diff:  # fmt: skip
    """`only`: section names to keep (all when empty). `code_stat`: `git diff --stat` between the
    commits, computed by the caller (this module runs nothing)."""
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; sections: {', '.join(SECTIONS)}")
    builders: dict[str, Callable[[], Section]] = {
        "stack": lambda: _stack(a, b),
        "code": lambda: _code(a, b, code_stat),
        "params": lambda: _mapping("params", _params(a), _params(b), "B"),
        "seed": lambda: _seed(a, b),
        "packages": lambda: _mapping("packages", _packages(a), _packages(b), "B"),
        "environment": lambda: _environment(a, b),
        "data": lambda: _mapping("data", _data(a), _data(b), "B"),
        "container": lambda: _mapping("container", _container(a), _container(b), "B"),
        "machine": lambda: _machine(a, b),
        "metrics": lambda: _metrics(a, b),
        "checkpoints": lambda: _mapping("checkpoints", _checkpoints(a), _checkpoints(b), "R"),
        "trace": lambda: _trace(trace_note),
    }
    sections = [builders[name]() for name in SECTIONS if not only or name in only]
    sections.sort(key=lambda s: (CLASS_ORDER[s.klass] if s.changes else 9, SECTIONS.index(s.name)))
    experiments = (str(a.get("experiment")), str(b.get("experiment")))
    notes = []
    if experiments[0] != experiments[1]:
        notes.append(f"the runs belong to different experiments: {experiments[0]} and {experiments[1]}")
    return Diff(str(a.get("run_id")), str(b.get("run_id")), experiments, tuple(sections), tuple(notes))


def _mapping(name: str, a: Mapping[str, Any], b: Mapping[str, Any], klass: str,
             classify: Callable[[str], str] | None = None) -> Section:  # fmt: skip
    changes, equal = [], 0
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, MISSING), b.get(key, MISSING)
        if va == vb:
            equal += 1
            continue
        note = "added" if key not in a else "removed" if key not in b else None
        changes.append(Change(key, va, vb, classify(key) if classify else klass, note))
    changes.sort(key=lambda c: CLASS_ORDER[c.klass])
    return Section(name, tuple(changes), equal)


def _params(m: Mapping[str, Any]) -> dict[str, Any]:
    values = flatten((m.get("params") or {}).get("values") or {})
    values.pop("seed", None)
    return values


def _seed(a: Mapping[str, Any], b: Mapping[str, Any]) -> Section:
    def view(m: Mapping[str, Any]) -> dict[str, Any]:
        determinism = m.get("determinism") or {}
        out = {"seed": (m.get("params") or {}).get("seed"), "determinism.mode": determinism.get("mode")}
        if both_have_flags:  # `current` has not imported torch: its flags are unknown, not absent
            for key, value in (determinism.get("flags_at_start") or {}).items():
                out[f"flags.{key}"] = value
        return out

    both_have_flags = all((m.get("determinism") or {}).get("flags_at_start") for m in (a, b))

    return _mapping("seed", view(a), view(b), "B")


def _packages(m: Mapping[str, Any]) -> dict[str, Any]:
    packages = (m.get("python") or {}).get("packages") or {}
    return {
        name: (info.get("version") if isinstance(info, dict) else info) for name, info in packages.items()
    }


def _stack(a: Mapping[str, Any], b: Mapping[str, Any]) -> Section:
    def view(m: Mapping[str, Any]) -> dict[str, Any]:
        torch = m.get("torch") or {}
        out = {f"torch.{k}": torch.get(k) for k in (*TORCH_CLASS_A, "num_threads", "num_interop_threads")}
        gpus = torch.get("gpus") or (m.get("hardware") or {}).get("gpus") or []
        out["gpus"] = [g.get("name") for g in gpus] if isinstance(gpus, list) else []
        out["cpu.model"] = ((m.get("hardware") or {}).get("cpu") or {}).get("model")
        out["python"] = (m.get("python") or {}).get("version")
        return {k: v for k, v in out.items() if v is not None}

    def classify(key: str) -> str:
        return "B" if key.endswith("threads") else "A"

    return _mapping("stack", view(a), view(b), "A", classify)


def _code(a: Mapping[str, Any], b: Mapping[str, Any], stat: str | None) -> Section:
    def view(m: Mapping[str, Any]) -> dict[str, Any]:
        git = m.get("git") or {}
        command = m.get("command") or {}
        out: dict[str, Any] = {"commit": git.get("commit"), "patch": (git.get("patch") or {}).get("sha256")}
        if both_have_commands:  # `current` runs nothing: it has no command to compare
            out.update(script=command.get("script"), argv=command.get("argv"))
        for item in git.get("untracked") or []:
            out[f"untracked:{item.get('path')}"] = item.get("sha256")
        return out

    both_have_commands = all(m.get("command") for m in (a, b))
    section = _mapping("code", view(a), view(b), "B")
    if stat and any(c.key == "commit" for c in section.changes):
        changes = tuple(
            Change(c.key, c.a, c.b, c.klass, stat.strip()) if c.key == "commit" else c
            for c in section.changes
        )
        return Section("code", changes, section.equal)
    return section


def _environment(a: Mapping[str, Any], b: Mapping[str, Any]) -> Section:
    def view(m: Mapping[str, Any]) -> dict[str, Any]:
        # cascade's own variables (run dir, store) differ by design; PYTHONHASHSEED follows the seed
        out = {k: v for k, v in (m.get("environment") or {}).items() if not k.startswith(OWN_VARIABLES)}
        for key, value in (m.get("environment_read") or {}).items():
            out[f"read:{key}"] = value
        return out

    return _mapping("environment", view(a), view(b), "B")


def _data(m: Mapping[str, Any]) -> dict[str, Any]:
    return dict(data_objects(m.get("data") or []))


def _container(m: Mapping[str, Any]) -> dict[str, Any]:
    container = m.get("container") or {}
    return {
        k: container.get(k)
        for k in ("image", "image_id", "repo_digest", "dockerfile_sha256")
        if container.get(k)
    }


def _machine(a: Mapping[str, Any], b: Mapping[str, Any]) -> Section:
    def view(m: Mapping[str, Any]) -> dict[str, Any]:
        hardware = m.get("hardware") or {}
        return {
            "hostname": hardware.get("hostname"),
            "memory_mb": hardware.get("memory_mb"),
            "cpu.count": (hardware.get("cpu") or {}).get("count"),
            "os": (hardware.get("os") or {}).get("release"),
        }

    return _mapping("machine", view(a), view(b), "C")


def _metrics(a: Mapping[str, Any], b: Mapping[str, Any]) -> Section:
    def view(m: Mapping[str, Any]) -> dict[str, Any]:
        keys = ((m.get("metrics") or {}).get("keys")) or {}
        out = {}
        for key, stats in keys.items():
            if key.startswith("cascade."):
                continue
            out[f"{key} (last)"] = stats.get("last")
            out[f"{key} (min)"] = stats.get("min")
        return out

    if not all(((m.get("metrics") or {}).get("keys")) for m in (a, b)):
        return Section("metrics", (), 0)  # `current`, or a run that logged nothing: nothing to compare
    section = _mapping("metrics", view(a), view(b), "R")
    changes = tuple(
        Change(c.key, c.a, c.b, c.klass, f"Δ {c.b - c.a:+.4g}")
        if isinstance(c.a, (int, float)) and isinstance(c.b, (int, float))
        else c
        for c in section.changes
    )
    return Section("metrics", changes, section.equal)


def _checkpoints(m: Mapping[str, Any]) -> dict[str, Any]:
    return {str(c.get("path")): c.get("md5") for c in m.get("checkpoints") or [] if c.get("status") == "kept"}


def _trace(note: str | None) -> Section:
    if note is None:
        return Section("trace", (), 0)
    if note.startswith(("BITWISE_IDENTICAL", "all ")):
        return Section("trace", (), 1)
    return Section("trace", (Change("first divergence", None, None, "R", note),), 0)
