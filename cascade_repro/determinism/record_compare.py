"""The one comparison of two run records: each field that decides reproduction, with its class.

`cascade diff` shows it, `cascade verify` ranks its changes as likely causes, `cascade check` and
restore's machine report read its stack and environment. Pure: two records in, a `RecordDiff` out.

Classes (docs/architecture.md, "the fingerprint"): A, bitwise equality is impossible across the
change (another torch build, CPU, GPU); B, it should not differ in a faithful rerun (a likely root
cause); C, informational. Each change also has a kind (params, seed, torch, ...): the unit that
`verify` names a cause in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from cascade_repro.determinism import script_seeds
from cascade_repro.determinism.catalogue import CONTAINER_FIELDS, TORCH_CLASS_A, TORCH_CLASS_B, lookup
from cascade_repro.distributed import is_launcher_variable
from cascade_repro.manifest import Manifest
from cascade_repro.params import flatten

SECTIONS = ("stack", "code", "params", "seed", "packages", "environment", "data", "container", "machine")
CLASS_ORDER = {"A": 0, "B": 1, "C": 2, "R": 3}  # R: results (metrics, checkpoints, trace), shown by diff
# Not compared as environment: cascade's own variables differ by design (run dir, store), and the
# seed-derived ones are set from the seed by `cascade run`: part of the seed, never a cause of their own.
OWN_VARIABLES = ("CASCADE_", "MLFLOW_")
SEED_DERIVED = ("PYTHONHASHSEED",)
MISSING = None


@dataclass(frozen=True)
class Change:
    """One field that differs. `a`/`b` are None where a record lacks it (`note` says which)."""

    key: str
    a: Any
    b: Any
    klass: str  # A, B, C or R (results)
    note: str | None = None
    kind: str = ""  # the cause it belongs to: params, seed, code, torch, environment, ...

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "a": self.a, "b": self.b, "class": self.klass, "note": self.note}


@dataclass(frozen=True)
class Section:
    """The changes of one section of the record, and how many compared fields are equal."""

    name: str
    changes: tuple[Change, ...]
    equal: int

    @property
    def klass(self) -> str:
        return min((c.klass for c in self.changes), key=CLASS_ORDER.__getitem__, default="C")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "class": self.klass, "equal": self.equal,
                "changes": [c.to_dict() for c in self.changes]}  # fmt: skip


@dataclass(frozen=True)
class RecordDiff:
    """Every compared section of two records, in `SECTIONS` order."""

    sections: tuple[Section, ...]

    @property
    def changes(self) -> tuple[Change, ...]:
        return tuple(c for s in self.sections for c in s.changes)

    def section(self, name: str) -> Section:
        return next(s for s in self.sections if s.name == name)


def compare_records(a: Manifest, b: Manifest, only: tuple[str, ...] = ()) -> RecordDiff:
    """Compare two records (or a record and a partial one of this machine); `only`: sections to keep.

    >>> [c.key for c in compare_records(run_a, run_b, only=("params",)).changes]
    ['optimizer.lr']
    """
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; sections: {', '.join(SECTIONS)}")
    builders: dict[str, Callable[[], Section]] = {
        "stack": lambda: _stack(a, b),
        "code": lambda: _code(a, b),
        "params": lambda: _mapping("params", *_params(a, b)),
        "seed": lambda: _seed(a, b),
        "packages": lambda: _packages(a, b),
        "environment": lambda: _environment(a, b),
        "data": lambda: _data_section(a, b),
        "container": lambda: _mapping("container", _container(a), _container(b)),
        "machine": lambda: _mapping("machine", _machine(a), _machine(b)),
    }
    return RecordDiff(tuple(builders[name]() for name in SECTIONS if not only or name in only))


def same_torch_version(a: Any, b: Any) -> bool:
    """Whether two torch versions name the same build.

    The public versions must be equal; the local label (`+cu130`, `+cpu`) counts only when both sides
    have one. PyPI's CUDA wheels say `2.14.1` in their package metadata and `2.14.1+cu130` in
    `torch.__version__`, so a missing label tells where the version was read, not which build it is;
    the build itself is then told by the stack's cuda and hip fields, where both records have them.
    """
    if a == b:
        return True
    if not a or not b:
        return False
    public_a, _, label_a = str(a).partition("+")
    public_b, _, label_b = str(b).partition("+")
    return public_a == public_b and (not label_a or not label_b or label_a == label_b)


def gpu_names(record: Manifest) -> list[str]:
    return [str(g.get("name")) for g in record.gpus]


def _mapping(name: str, a: Mapping[str, Any], b: Mapping[str, Any],
             same: Callable[[str, Any, Any], bool] | None = None) -> Section:  # fmt: skip
    """The keys of one section that differ, each with its class and kind from the catalogue."""
    changes, equal = [], 0
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, MISSING), b.get(key, MISSING)
        if va == vb or (same is not None and key in a and key in b and same(key, va, vb)):
            equal += 1
            continue
        note = "added" if key not in a else "removed" if key not in b else None
        field = lookup(name, key)
        changes.append(Change(key, va, vb, field.klass, note, field.kind))
    changes.sort(key=lambda c: CLASS_ORDER[c.klass])
    return Section(name, tuple(changes), equal)


def _stack(a: Manifest, b: Manifest) -> Section:
    # A record made without importing torch (this machine before a restore, a run whose child could
    # not probe it) knows only the installed version: then the version is all that is compared.
    probed = a.torch.probed and b.torch.probed
    both_ran = a.ran and b.ran  # `current` runs nothing
    fields = [*TORCH_CLASS_A, *TORCH_CLASS_B] if probed else ["version"]

    def view(m: Manifest) -> dict[str, Any]:
        out = {f"torch.{k}": m.torch.get(k) for k in fields}
        out["gpus"] = gpu_names(m)
        out["cpu.model"] = m.hardware.cpu_model
        out["python"] = m.python.version
        if both_ran:  # a property of the run (torchrun's processes), not of a machine
            out["world_size"] = m.world_size
            out["nnodes"] = m.nnodes  # collectives cross a network, or not: another reduction order
        return {k: v for k, v in out.items() if v is not None}

    def same(key: str, va: Any, vb: Any) -> bool:
        return key == "torch.version" and same_torch_version(va, vb)

    return _mapping("stack", view(a), view(b), same)


def _code(a: Manifest, b: Manifest) -> Section:
    both_have_commands = a.ran and b.ran  # `current` runs nothing

    def view(m: Manifest) -> dict[str, Any]:
        out: dict[str, Any] = {"commit": m.git.commit, "patch": m.git.patch_sha256}
        if both_have_commands:
            command = m.command
            out.update(script=command.get("script"), module=command.get("module"), argv=command.get("argv"))
        for item in m.git.untracked:
            out[f"untracked:{item.path}"] = item.sha256
        return out

    return _mapping("code", view(a), view(b))


def _params(a: Manifest, b: Manifest) -> tuple[dict[str, Any], dict[str, Any]]:
    """What each run's script used; against `current` (which runs nothing, so knows no argparse
    namespace and no read) the params files, as resolved."""
    both_ran = a.ran and b.ran

    def view(m: Manifest) -> dict[str, Any]:
        params = m.params
        file = params.get("file") if "file" in params else {"values": params.get("values")}
        values = flatten((params if both_ran else file or {}).get("values") or {})
        values.pop("seed", None)  # the seed section's
        return values

    return view(a), view(b)


def _seed(a: Manifest, b: Manifest) -> Section:
    # `current` has not imported torch: its flags are unknown, not absent
    both_have_flags = all(m.determinism.get("flags_at_start") for m in (a, b))

    # The seeds the script set itself: known for records made since they were recorded.
    both_know_script_seeds = all(script_seeds.calls(m.determinism) is not None for m in (a, b))

    def view(m: Manifest) -> dict[str, Any]:
        determinism = m.determinism
        out = {"seed": m.seed, "determinism.mode": determinism.get("mode")}
        if both_know_script_seeds:
            out["script_seeds"] = ", ".join(script_seeds.described(determinism)) or None
        if both_have_flags:
            start = determinism.get("flags_at_start") or {}
            for key, value in start.items():
                out[f"flags.{key}"] = value
            left = m.torch.get("flags")  # as the script left them (torch.set_float32_matmul_precision)
            for key, value in (left if isinstance(left, dict) else {}).items():
                if value != start.get(key):
                    out[f"script_flags.{key}"] = value
        return out

    section = _mapping("seed", view(a), view(b))
    if not (both_know_script_seeds and all(script_seeds.had_no_effect(m.determinism) for m in (a, b))):
        return section
    # Both scripts seeded every generator themselves before step 0: cascade's seed decided nothing.
    taken = [g for g in script_seeds.overridden(a.determinism) if g in script_seeds.overridden(b.determinism)]
    note = f"the script seeds {script_seeds.words(taken)} itself: this seed had no effect"
    changes = [Change(c.key, c.a, c.b, "C", note, c.kind) if c.key == "seed" else c for c in section.changes]
    changes.sort(key=lambda c: CLASS_ORDER[c.klass])
    return Section("seed", tuple(changes), section.equal)


def _packages(a: Manifest, b: Manifest) -> Section:
    def view(m: Manifest) -> dict[str, Any]:
        return {name: version for name, version in m.python.package_versions.items() if name != "torch"}

    if not all(m.python.packages for m in (a, b)):
        return Section("packages", (), 0)  # a record without a package list cannot say what changed

    return _mapping("packages", view(a), view(b))


def _environment(a: Manifest, b: Manifest) -> Section:
    # What a script read is known only for records of runs (`current` and this machine ran nothing).
    both_ran = a.environment_read is not None and b.environment_read is not None
    read_a, read_b = a.variables_read, b.variables_read

    def view(m: Manifest) -> dict[str, Any]:
        own = (*OWN_VARIABLES, *SEED_DERIVED)
        out: dict[str, Any] = {
            k: v for k, v in m.environment.items() if not k.startswith(own) and not is_launcher_variable(k)
        }
        if both_ran:
            for key, value in m.variables_read.items():
                out[f"read:{key}"] = value
        return out

    def one_run_only(key: str) -> bool:  # its code differs, which the code section names
        name = key.removeprefix("read:")
        return key.startswith("read:") and not (name in read_a and name in read_b)

    section = _mapping("environment", view(a), view(b))
    changes = sorted(
        (Change(c.key, c.a, c.b, "C", "read by one run only", c.kind) if one_run_only(c.key) else c
         for c in section.changes),
        key=lambda c: CLASS_ORDER[c.klass],
    )  # fmt: skip
    return Section("environment", tuple(changes), section.equal)


def _data_section(a: Manifest, b: Manifest) -> Section:
    """The data that differs; an input an earlier run wrote says which run, on each side (two
    evaluations of models from two training runs: the runs to compare next)."""
    section = _mapping("data", _data(a), _data(b))
    writers_a, writers_b = ({i.path: i.written_by for i in m.inputs if i.written_by} for m in (a, b))
    changes = []
    for change in section.changes:
        wrote = (writers_a.get(change.key), writers_b.get(change.key))
        if any(wrote):
            said = " · ".join(f"written by run {w[:8]}" if w else "-" for w in wrote)
            change = replace(change, note=f"{change.note}; {said}" if change.note else said)
        changes.append(change)
    return Section("data", tuple(changes), section.equal)


def _data(m: Manifest) -> dict[str, Any]:
    """DVC objects by md5, and the inputs neither git nor DVC tracked by sha256 (cached or not)."""
    found: dict[str, Any] = dict(m.data_objects)
    for item in m.inputs:
        found[item.path] = item.sha256
    return found


def _container(m: Manifest) -> dict[str, Any]:
    return {k: m.container.get(k) for k in CONTAINER_FIELDS if m.container.get(k)}


def _machine(m: Manifest) -> dict[str, Any]:
    hardware = m.hardware
    return {
        "hostname": hardware.hostname,
        "memory_mb": hardware.memory_mb,
        "cpu.count": hardware.cpu_count,
        "os": hardware.os_release,
    }
