"""The restore plan: a run record, checked whole, turned into what restore will do on this machine.

The record is untrusted (it may come from a shared server): every path it names is checked here,
before anything is written; the plan also says which environment the re-run gets and how this
machine differs from the recorded one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from cascade_repro import confined, run_target
from cascade_repro.determinism.explain import Difference
from cascade_repro.determinism.record_compare import compare_records
from cascade_repro.distributed import MAX_NPROC_PER_NODE, is_launcher_variable
from cascade_repro.errors import RestoreRefused
from cascade_repro.manifest import Manifest
from cascade_repro.record_sections import CheckpointEntry, DataEntry, FileEntry, GitSection
from cascade_repro.redaction import SecretSlot, is_redacted, secret_slots
from cascade_repro.restore.safety import safe_link, safe_path, untracked_links, written_paths
from cascade_repro.restore.variables import NOT_RESTORED_PREFIXES, loads_code, recordable
from cascade_repro.settings import DEFAULT_ENV_PREFIXES


@dataclass(frozen=True)
class RestorePlan:
    """What restore will do, printed before anything heavy happens."""

    run_id: str
    version: str | None
    experiment: str
    commit: str
    dirty: bool
    patch: Mapping[str, Any] | None
    untracked: tuple[FileEntry, ...]
    unavailable: tuple[str, ...]  # untracked files the record names but did not keep
    data: tuple[DataEntry, ...]
    checkpoints: tuple[CheckpointEntry, ...]
    script: str
    argv: tuple[str, ...]
    cwd: str
    seed: int
    determinism: str
    trace_interval: int
    trace_budget: float  # the record's (0: every facet every step, as before budgets)
    trace_schedule: tuple[tuple[int, int], ...] | None  # the steps it sampled, to sample the same again
    trace_records: tuple[tuple[int, int], ...] | None  # the steps it recorded (a budget thinned them)
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
    inputs: tuple[FileEntry, ...] = ()
    input_sources: Mapping[str, str] = field(default_factory=dict)
    # files the run read outside the repository: named in the record, never hashed (the first 20)
    read_outside: tuple[str, ...] = ()
    read_outside_count: int = 0
    module: str | None = None  # a run of `-m MODULE`: run by its name again (`script` is its file)

    @property
    def shown(self) -> str:
        """What it runs, as typed: `-m MODULE`, else the script."""
        return " ".join(run_target.words(self.script, self.module))

    def written_paths(self) -> list[tuple[str, str]]:
        """Every file this restore may write: (path, what it is)."""
        return written_paths(
            Manifest(
                self.run_id,
                self.experiment,
                data=self.data,
                checkpoints=self.checkpoints,
                inputs=self.inputs,
                git=GitSection({"untracked": [u.raw for u in self.untracked]}),
            )
        )

    def to_dict(self) -> dict[str, Any]:
        body = {k: v for k, v in vars(self).items() if k != "differences"}
        for name in ("untracked", "data", "checkpoints", "inputs"):
            body[name] = [entry.to_dict() for entry in body[name]]
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


def plan_restore(manifest: Manifest, version: str | None, workdir: Path, steps: int | None,
                 environ: Mapping[str, str], allow_prefixes: tuple[str, ...],
                 here: Manifest) -> RestorePlan:  # fmt: skip
    """Read the record and check every path in it; raises RestoreRefused before anything is written."""
    git, command = manifest.git, manifest.command
    commit = git.commit or ""
    if not commit and manifest.outcome.status == "KILLED":  # (stopped before the parent's capture ended)
        raise RestoreRefused(f"run {manifest.run_id} was KILLED before cascade recorded its code: its record "
                             "holds no git commit, so there is nothing to rebuild",  # fmt: skip
                             hint=f"`cascade show {manifest.run_id[:12]}` says what the record holds; run "
                             "the script again for a run that can be restored")  # fmt: skip
    if len(commit) not in (40, 64) or any(c not in "0123456789abcdef" for c in commit):  # SHA-1, SHA-256
        raise RestoreRefused(f"run {manifest.run_id} records no usable git commit ({commit!r})")
    script = safe_path(str(command.get("script") or ""), "the script")
    module = command.get("module")
    if module is not None and not run_target.is_module_name(module):
        raise RestoreRefused(f"run {manifest.run_id} records {str(module)[:80]!r} as the module it ran: "
                             "not a module name")  # fmt: skip
    if module is not None and not run_target.may_be_its_file(module, script):  # (checked again once written)
        raise RestoreRefused(f"run {manifest.run_id} records `-m {module}` as the script {script}, which is "
                             "not that module's file: it is not run")  # fmt: skip
    cwd = safe_path(str(command.get("cwd") or "."), "the working directory", allow_dot=True)
    stored, unavailable = [], []
    for item in git.untracked:
        path = safe_path(item.path, "an untracked file")
        if item.symlink_target is not None:
            safe_link(path, item.symlink_target)
        if item.stored:
            stored.append(item)
        else:
            unavailable.append(path)
    _check_written_paths(manifest)
    return RestorePlan(
        run_id=manifest.run_id,
        version=version,
        experiment=manifest.experiment,
        commit=commit,
        dirty=git.dirty,
        patch=git.patch,
        untracked=tuple(stored),
        unavailable=tuple(unavailable),
        data=manifest.data,
        checkpoints=manifest.checkpoints,
        script=script,
        module=module,
        argv=tuple(str(a) for a in command.get("argv") or ()),
        cwd=cwd,
        seed=int(manifest.params.get("seed", 0)),
        determinism=manifest.determinism_mode,
        trace_interval=int(manifest.trace_header.get("interval") or 0),
        trace_budget=_trace_budget(manifest.trace_header.get("budget")),
        trace_schedule=_schedule(manifest.trace_header.get("schedule")),
        trace_records=_schedule(manifest.trace_header.get("records")),
        environment=recorded_environment(
            manifest.environment, environ, allow_prefixes, manifest.variables_read
        ),
        differences=tuple(machine_differences(manifest, here, allow_prefixes)),
        workdir=workdir,
        steps=steps,
        num_threads=manifest.torch.num_threads,
        nproc_per_node=_processes(manifest),
        **_redacted_sources(manifest, environ),
        inputs=manifest.inputs,
        read_outside=tuple(manifest.outcome.read_outside[0]),
        read_outside_count=manifest.outcome.read_outside[1],
    )


def _check_written_paths(manifest: Manifest) -> None:
    """The paths restore may write (data, inputs, kept checkpoints) stay inside the worktree."""
    for data in manifest.data:
        safe_path(data.path, "a data path")
    for item in manifest.inputs:
        safe_path(item.path, "an input file")
    for checkpoint in manifest.kept_checkpoints:  # the ones restore may write
        safe_path(checkpoint.path, "a checkpoint path")
    # chains of the record's own symlinks, each harmless as text, may still lead out together
    confined.refuse_escapes(untracked_links(manifest.git.untracked), written_paths(manifest))


def _trace_budget(value: Any) -> float:
    """The recorded trace budget, 0 where absent or not a share of step time (the record may be hostile)."""
    from cascade_repro.child.trace_budget import parse_budget

    return parse_budget(value) or 0.0


def _schedule(value: Any) -> tuple[tuple[int, int], ...] | None:
    from cascade_repro.child.trace_budget import parse_schedule

    schedule = parse_schedule(value)
    return tuple(schedule) if schedule is not None else None


def _processes(manifest: Manifest) -> int | None:
    """The recorded job's world size, all on this machine (checked against MAX_NPROC_PER_NODE); None
    for a single process."""
    if not manifest.layout:
        return None
    size = manifest.world_size
    if size > MAX_NPROC_PER_NODE:
        raise RestoreRefused(f"the run was a torchrun job of {size} processes; a restore starts them all on "
                             f"this machine, at most {MAX_NPROC_PER_NODE}",
                             hint="multi-node restore is not supported yet")  # fmt: skip
    return size


def _redacted_sources(manifest: Manifest, environ: Mapping[str, str]) -> dict[str, Any]:
    """Where the values the record redacted come from: argv from CASCADE_SECRET_* variables,
    environment variables from this machine."""
    slots = secret_slots([str(a) for a in manifest.command.get("argv") or ()])
    recorded = {**manifest.variables_read, **manifest.environment}
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
    What no honest run records, or what loads code, is never set (`held_back`); what loads code is
    never unset either (PYTHONPATH: the re-run finds its packages as this shell does)."""
    changes: dict[str, str | None] = {}
    for names, is_read in ((read or {}, True), (recorded, False)):
        for name, value in names.items():
            if _restorable(name, value, allow_prefixes, is_read) and environ.get(name) != value:
                changes[name] = value
    for name in environ:
        if (
            name.startswith(allow_prefixes)
            and not name.startswith(NOT_RESTORED_PREFIXES)
            and name not in recorded
            and not loads_code(name)
        ) and name != "PYTHONHASHSEED":
            changes[name] = None
    return changes


def held_back(manifest: Manifest, environ: Mapping[str, str], allow_prefixes: tuple[str, ...]) -> list[str]:
    """The record's variables a re-run does not get though they differ here: they load code, or no run
    recorded here holds them (a record from elsewhere, or altered). The plan names them."""
    names = {name: True for name in manifest.variables_read}
    names.update({name: False for name in manifest.environment})
    values = {**manifest.variables_read, **manifest.environment}
    return sorted(
        name for name, is_read in names.items()
        if not _skipped(name, values[name]) and values[name] not in (None, environ.get(name))
        and not _restorable(name, values[name], allow_prefixes, is_read)
    )  # fmt: skip


def _restorable(name: str, value: str | None, allow_prefixes: tuple[str, ...], is_read: bool) -> bool:
    return (not _skipped(name, value) and not loads_code(name)
            and recordable(name, allow_prefixes, is_read))  # fmt: skip


def _skipped(name: str, value: str | None) -> bool:
    """cascade's own and MLflow's, a redacted value, a launcher's (the recorded job's torchrun set
    it; the re-run's torchrun does), PYTHONHASHSEED (restore sets it from the record's seed)."""
    return (name.startswith(NOT_RESTORED_PREFIXES) or is_redacted(value) or is_launcher_variable(name)
            or name == "PYTHONHASHSEED")  # fmt: skip


def machine_differences(manifest: Manifest, here: Manifest,
                        allow_prefixes: tuple[str, ...] | None = None) -> list[Difference]:
    """This machine (`here`: a partial record made without importing torch) against the record, as
    the one comparator (`record_compare`) sees them: one line per kind. Class A means bitwise equality
    is not expected here; class B variables are set by restore.
    """
    compared = compare_records(manifest, here, only=("stack", "environment"))
    held = held_back(manifest, here.environment, allow_prefixes or DEFAULT_ENV_PREFIXES)
    words = {"torch.version": "torch", "gpus": "GPUs", "cpu.model": "CPU", "python": "Python"}
    lines: dict[str, list[str]] = {}
    for c in compared.section("stack").changes:
        if c.klass == "A":
            word = words.get(c.key, c.key.replace(".", " "))
            lines.setdefault(c.kind, []).append(f"{word} {_shown(c.a)} recorded, {_shown(c.b)} here")
    out = [Difference(kind, "A", "; ".join(found)) for kind, found in lines.items()]
    env = [
        c.key for c in compared.section("environment").changes
        if c.kind == "environment" and not is_redacted(c.a) and c.key not in held
    ]  # fmt: skip
    if env:
        out.append(
            Difference("environment", "B", "set to the recorded values for the re-run: " + ", ".join(env))
        )
    if held:
        out.append(Difference("environment", "B", f"not set from the record: {', '.join(held)} (they load "
                              "code from where they point, or no run recorded here holds them; export them "
                              "yourself if you trust the values)"))  # fmt: skip
    return out


def _shown(value: Any) -> str:
    return "none" if value is None or value == [] else str(value)
