"""The restore plan: a run record, checked whole, turned into what restore will do on this machine.

The record is untrusted (it may come from a shared server): every path it names is checked here,
before anything is written; the plan also says which environment the re-run gets and how this
machine differs from the recorded one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from cascade_repro import confined
from cascade_repro.determinism.explain import Difference
from cascade_repro.determinism.record_compare import compare_records
from cascade_repro.distributed import MAX_NPROC_PER_NODE, is_launcher_variable, recorded_layout, world_size
from cascade_repro.errors import RestoreRefused
from cascade_repro.redaction import SecretSlot, is_redacted, secret_slots
from cascade_repro.restore.safety import safe_link, safe_path, untracked_links, written_paths

# Variables restore never copies from a record: they point at this machine's store and run.
NOT_RESTORED_PREFIXES = ("MLFLOW_", "CASCADE_")


@dataclass(frozen=True)
class RestorePlan:
    """What restore will do, printed before anything heavy happens."""

    run_id: str
    version: str | None
    experiment: str
    commit: str
    dirty: bool
    patch: Mapping[str, Any] | None
    untracked: tuple[Mapping[str, Any], ...]
    unavailable: tuple[str, ...]  # untracked files the record names but did not keep
    data: tuple[Mapping[str, Any], ...]
    checkpoints: tuple[Mapping[str, Any], ...]
    script: str
    argv: tuple[str, ...]
    cwd: str
    seed: int
    determinism: str
    trace_interval: int
    environment: Mapping[str, str | None]  # value to set, or None to unset
    differences: tuple[Difference, ...]  # this machine vs the record
    workdir: Path
    steps: int | None = None
    num_threads: int | None = None  # torch's intra-op threads in the recorded run, set for the re-run
    # a torchrun job: the processes the re-run starts on this machine (the recorded world size)
    nproc_per_node: int | None = None
    secret_args: tuple[SecretSlot, ...] = ()  # redacted argv values, each from its CASCADE_SECRET_* variable
    secrets_missing: tuple[str, ...] = ()  # those variables unset here: the re-run is refused
    secret_env: Mapping[str, bool] = field(default_factory=dict)  # redacted variables → set here (kept)
    # files the run read that neither git nor DVC tracked (record's `inputs`), and where each comes
    # from here (locate_inputs): "dvc" (cached with --track-inputs), "checkout", "missing", "changed"
    inputs: tuple[Mapping[str, Any], ...] = ()
    input_sources: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        body = {k: v for k, v in vars(self).items() if k != "differences"}
        body["workdir"] = str(self.workdir)
        body["differences"] = [d.to_dict() for d in self.differences]
        body["secret_args"] = [s.to_dict() for s in self.secret_args]
        return body


@dataclass(frozen=True)
class Worktree:
    """The restore worktree: where it is, whether it was reused, the untracked files written into it."""

    path: Path
    reused: bool
    restored_files: tuple[str, ...] = field(default_factory=tuple)


def plan_restore(manifest: Mapping[str, Any], version: str | None, workdir: Path, steps: int | None,
                 environ: Mapping[str, str], allow_prefixes: tuple[str, ...],
                 here: Mapping[str, Any]) -> RestorePlan:  # fmt: skip
    """Read the record and check every path in it; raises RestoreRefused before anything is written."""
    git = manifest.get("git") or {}
    command = manifest.get("command") or {}
    commit = str(git.get("commit") or "")
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        raise RestoreRefused(f"run {manifest.get('run_id')} records no usable git commit ({commit!r})")
    script = safe_path(str(command.get("script") or ""), "the script")
    cwd = safe_path(str(command.get("cwd") or "."), "the working directory", allow_dot=True)
    stored, unavailable = [], []
    for item in git.get("untracked") or []:
        path = safe_path(str(item.get("path") or ""), "an untracked file")
        target = item.get("symlink_target")
        if target is not None:
            safe_link(path, str(target))
        if item.get("stored"):
            stored.append(item)
        else:
            unavailable.append(path)
    for item in manifest.get("data") or []:
        safe_path(str(item.get("path") or ""), "a data path")
    for item in manifest.get("inputs") or []:
        safe_path(str(item.get("path") or ""), "an input file")
    for item in manifest.get("checkpoints") or []:
        if item.get("status") == "kept" and item.get("md5"):  # the ones restore may write
            safe_path(str(item.get("path") or ""), "a checkpoint path")
    # chains of the record's own symlinks, each harmless as text, may still lead out together
    confined.refuse_escapes(untracked_links(git.get("untracked") or []), written_paths(manifest))
    params = manifest.get("params") or {}
    trace = manifest.get("trace") or {}
    return RestorePlan(
        run_id=str(manifest.get("run_id")),
        version=version,
        experiment=str(manifest.get("experiment")),
        commit=commit,
        dirty=bool(git.get("dirty")),
        patch=git.get("patch"),
        untracked=tuple(stored),
        unavailable=tuple(unavailable),
        data=tuple(manifest.get("data") or ()),
        checkpoints=tuple(manifest.get("checkpoints") or ()),
        script=script,
        argv=tuple(str(a) for a in command.get("argv") or ()),
        cwd=cwd,
        seed=int(params.get("seed", 0)),
        determinism=str((manifest.get("determinism") or {}).get("mode") or "warn"),
        trace_interval=int(trace.get("interval") or 0),
        environment=recorded_environment(
            manifest.get("environment") or {}, environ, allow_prefixes, manifest.get("environment_read") or {}
        ),
        differences=tuple(machine_differences(manifest, here)),
        workdir=workdir,
        steps=steps,
        num_threads=_int_or_none((manifest.get("torch") or {}).get("num_threads")),
        nproc_per_node=_processes(manifest),
        **_redacted_sources(manifest, environ),
        inputs=tuple(manifest.get("inputs") or ()),
    )


def _processes(manifest: Mapping[str, Any]) -> int | None:
    """The recorded job's world size, all on this machine (checked against MAX_NPROC_PER_NODE); None
    for a single process."""
    layout = recorded_layout(manifest)
    if not layout:
        return None
    size = world_size(manifest)
    if size > MAX_NPROC_PER_NODE:
        raise RestoreRefused(f"the run was a torchrun job of {size} processes; a restore starts them all on "
                             f"this machine, at most {MAX_NPROC_PER_NODE}",
                             hint="multi-node restore is not supported yet")  # fmt: skip
    return size


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _redacted_sources(manifest: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Where the values the record redacted come from: argv from CASCADE_SECRET_* variables,
    environment variables from this machine."""
    slots = secret_slots([str(a) for a in (manifest.get("command") or {}).get("argv") or ()])
    recorded = {**(manifest.get("environment_read") or {}), **(manifest.get("environment") or {})}
    return {
        "secret_args": tuple(slots),
        "secrets_missing": tuple(s.variable for s in slots if s.variable not in environ),
        "secret_env": {
            name: name in environ
            for name, value in sorted(recorded.items())
            if is_redacted(value) and not name.startswith(NOT_RESTORED_PREFIXES)
        },
    }


def recorded_environment(recorded: Mapping[str, str], environ: Mapping[str, str],
                         allow_prefixes: tuple[str, ...],
                         read: Mapping[str, str | None] | None = None) -> dict[str, str | None]:  # fmt: skip
    """The allow-listed variables and those the script read, as recorded: set what differs, unset what
    the run did not have. Redacted values cannot be restored; the variable is left as it is here.
    """
    changes: dict[str, str | None] = {}
    for name, value in (read or {}).items():
        if name.startswith(NOT_RESTORED_PREFIXES) or is_redacted(value) or is_launcher_variable(name):
            continue
        if environ.get(name) != value:
            changes[name] = value
    for name, value in recorded.items():
        if name.startswith(NOT_RESTORED_PREFIXES) or is_redacted(value) or name == "PYTHONHASHSEED":
            continue
        if is_launcher_variable(name):  # the recorded job's torchrun set it; the re-run's torchrun does
            continue
        if environ.get(name) != value:
            changes[name] = value
    for name in environ:
        if (
            name.startswith(allow_prefixes)
            and not name.startswith(NOT_RESTORED_PREFIXES)
            and name not in recorded
        ) and name != "PYTHONHASHSEED":
            changes[name] = None
    return changes


def machine_differences(manifest: Mapping[str, Any], here: Mapping[str, Any]) -> list[Difference]:
    """This machine (`here`: a partial record made without importing torch) against the record, as
    the one comparator (`record_compare`) sees them: one line per kind. Class A means bitwise equality
    is not expected here; class B variables are set by restore.
    """
    compared = compare_records(manifest, here, only=("stack", "environment"))
    words = {"torch.version": "torch", "gpus": "GPUs", "cpu.model": "CPU", "python": "Python"}
    lines: dict[str, list[str]] = {}
    for c in compared.section("stack").changes:
        if c.klass == "A":
            word = words.get(c.key, c.key.replace(".", " "))
            lines.setdefault(c.kind, []).append(f"{word} {_shown(c.a)} recorded, {_shown(c.b)} here")
    out = [Difference(kind, "A", "; ".join(found)) for kind, found in lines.items()]
    env = [
        c.key for c in compared.section("environment").changes
        if c.kind == "environment" and not is_redacted(c.a)
    ]  # fmt: skip
    if env:
        out.append(
            Difference("environment", "B", "set to the recorded values for the re-run: " + ", ".join(env))
        )
    return out


def _shown(value: Any) -> str:
    return "none" if value is None or value == [] else str(value)
