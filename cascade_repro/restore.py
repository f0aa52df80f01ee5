"""Restore a recorded run: record → plan → isolated git worktree with the exact dirty state.

The record may come from a shared server and is not trusted: every path it names is checked before
anything is written, every file it carries is checked against its sha256, and the worktree is never
the user's checkout. Re-execution and verification are composed by `api.restore`.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping

from cascade_repro import confined
from cascade_repro.capture.git import capture_git, has_commit, sha256_of
from cascade_repro.determinism.explain import Difference
from cascade_repro.determinism.record_compare import compare_records
from cascade_repro.distributed import MAX_NPROC_PER_NODE, is_launcher_variable, recorded_layout, world_size
from cascade_repro.errors import CascadeError, RestoreRefused, UnsafeRecord
from cascade_repro.redaction import SecretSlot, is_redacted, secret_slots
from cascade_repro.store.run_store import RunStore

MARKER = "cascade-restore.json"  # in the worktree's own git dir, never in its files
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
    script = _safe_path(str(command.get("script") or ""), "the script")
    cwd = _safe_path(str(command.get("cwd") or "."), "the working directory", allow_dot=True)
    stored, unavailable = [], []
    for item in git.get("untracked") or []:
        path = _safe_path(str(item.get("path") or ""), "an untracked file")
        target = item.get("symlink_target")
        if target is not None:
            _safe_link(path, str(target))
        if item.get("stored"):
            stored.append(item)
        else:
            unavailable.append(path)
    for item in manifest.get("data") or []:
        _safe_path(str(item.get("path") or ""), "a data path")
    for item in manifest.get("inputs") or []:
        _safe_path(str(item.get("path") or ""), "an input file")
    for item in manifest.get("checkpoints") or []:
        if item.get("status") == "kept" and item.get("md5"):  # the ones restore may write
            _safe_path(str(item.get("path") or ""), "a checkpoint path")
    # chains of the record's own symlinks, each harmless as text, may still lead out together
    confined.refuse_escapes(_untracked_links(git.get("untracked") or []), _written_paths(manifest))
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


# -- paths from an untrusted record -------------------------------------------------------------
def _untracked_links(untracked: Any) -> dict[str, str]:
    return {
        posixpath.normpath(str(u["path"])): str(u["symlink_target"])
        for u in untracked
        if u.get("symlink_target") is not None
    }


def _written_paths(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every file a restore may write for this record: (path, what it is)."""
    git = manifest.get("git") or {}
    paths = [(str(u.get("path")), "the untracked file") for u in git.get("untracked") or []]
    paths += [(str(d.get("path")), "the data path") for d in manifest.get("data") or []]
    paths += [(str(i.get("path")), "the input file") for i in manifest.get("inputs") or []]
    paths += [
        (str(c.get("path")), "the checkpoint")
        for c in manifest.get("checkpoints") or []
        if c.get("status") == "kept" and c.get("md5")
    ]
    return paths


def _safe_path(path: str, what: str, allow_dot: bool = False) -> str:
    """A relative POSIX path that stays inside the worktree and out of `.git`."""
    normalized = posixpath.normpath(path) if path else ""
    if allow_dot and normalized == ".":
        return "."
    parts = PurePosixPath(path).parts
    if (
        not path
        or "\\" in path
        or "\0" in path
        or PurePosixPath(path).is_absolute()
        or ".." in parts
        or normalized in (".", "")
        or parts[0] == ".git"
    ):
        raise UnsafeRecord(f"unsafe record: {what} has the path {path!r}, which escapes the worktree")
    return normalized


def _safe_link(path: str, target: str, what: str = "the untracked symlink") -> None:
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if target.startswith("/") or joined == ".." or joined.startswith("../"):
        raise UnsafeRecord(f"unsafe record: {what} {path} points outside the worktree ({target})")


# -- inputs git and DVC could not see ---------------------------------------------------------------
def locate_inputs(plan: RestorePlan, root: Path) -> RestorePlan:
    """Where each recorded input comes from: the DVC cache (--track-inputs), else the user's checkout
    when the file there still has the recorded size and sha256; else it is missing or changed."""
    sources: dict[str, str] = {}
    real_root = os.path.realpath(root)
    for item in plan.inputs:
        rel = posixpath.normpath(str(item["path"]))
        if item.get("md5"):
            sources[rel] = "dvc"
            continue
        real = os.path.realpath(root / rel)
        if not real.startswith(real_root + os.sep) or not os.path.isfile(real):
            sources[rel] = "missing"
        elif os.path.getsize(real) != item.get("size") or sha256_of(Path(real)) != item.get("sha256"):
            sources[rel] = "changed"
        else:
            sources[rel] = "checkout"
    return replace(plan, input_sources=sources)


def inputs_not_here(plan: RestorePlan) -> list[str]:
    """`path (missing in your checkout)` / `path (changed: ...)` for each input restore cannot take."""
    recorded = {posixpath.normpath(str(i["path"])): i for i in plan.inputs}
    out = []
    for rel, source in plan.input_sources.items():
        if source == "missing":
            out.append(f"{rel} (missing in your checkout)")
        elif source == "changed":
            item = recorded[rel]
            out.append(f"{rel} (changed since the run: it read {item.get('size')} bytes with sha256 "
                       f"{str(item.get('sha256'))[:12]}…)")  # fmt: skip
    return out


def deliver_inputs(plan: RestorePlan, root: Path, workdir: Path) -> list[str]:
    """Copy the inputs taken from the checkout into the worktree (confined), each checked again there."""
    recorded = {posixpath.normpath(str(i["path"])): i for i in plan.inputs}
    copied = []
    for rel, source in plan.input_sources.items():
        if source != "checkout":
            continue
        expected = str(recorded[rel].get("sha256"))
        existing = workdir / rel
        if existing.is_file() and not existing.is_symlink() and sha256_of(existing) == expected:
            continue  # a reused worktree has it already
        original = Path(os.path.realpath(root / rel))
        written = confined.write_file(workdir, rel, original, f"the input file {rel}")
        if sha256_of(written) != expected:
            written.unlink(missing_ok=True)
            raise RestoreRefused(f"the input file {rel} changed in your checkout while it was copied",
                                 hint="let whatever writes it finish, then restore again")  # fmt: skip
        copied.append(rel)
    return copied


# -- materializing ----------------------------------------------------------------------------------
def stage_dirty_state(
    plan: RestorePlan, store: RunStore, staging: Path
) -> tuple[Path | None, dict[str, Path]]:
    """Download the patch and untracked files and check each against its sha256 (before any write)."""
    patch_file = None
    if plan.patch:
        local = _download(store, plan.run_id, str(plan.patch.get("artifact") or "cascade/git.patch"), staging)
        _check_sha256(local, str(plan.patch.get("sha256")), "the recorded patch (cascade/git.patch)")
        patch_file = local
    files: dict[str, Path] = {}
    for item in plan.untracked:
        if item.get("symlink_target") is not None:
            continue
        rel = str(item["path"])
        local = _download(store, plan.run_id, f"cascade/untracked/{rel}", staging / "untracked")
        _check_sha256(local, str(item.get("sha256")), f"the untracked file {rel}")
        files[rel] = local
    return patch_file, files


def materialize(plan: RestorePlan, root: Path, store: RunStore, notify: Callable[[str], None]) -> Worktree:
    """A git worktree at the recorded commit with the patch applied and untracked files restored.

    An existing worktree is reused when it is exactly what the last restore left; a worktree
    someone modified is refused, never overwritten.
    """
    if not has_commit(root, plan.commit):
        raise RestoreRefused(
            f"commit {plan.commit[:12]} of run {plan.run_id[:12]} is not in this repository",
            hint="git fetch it (e.g. `git fetch --all`) from the remote the run came from",
        )
    workdir = plan.workdir
    if workdir.exists() and any(workdir.iterdir()):
        state = _check_reusable(root, workdir, plan)
        removed = _remove_rerun_outputs(workdir, plan, state)
        write_marker(workdir, plan)
        notify(
            f"reusing the restore worktree {workdir} (unchanged since the last restore"
            + (f"; removed {len(removed)} file(s) the last re-run wrote)" if removed else ")")
        )
        return Worktree(workdir, reused=True)
    with tempfile.TemporaryDirectory(prefix="cascade-restore-") as tmp:
        patch_file, files = stage_dirty_state(plan, store, Path(tmp))
        patch_links = _check_patch_paths(root, patch_file) if patch_file is not None else {}
        record_links = _untracked_links(plan.untracked)
        confined.refuse_escapes({**record_links, **patch_links}, _plan_paths(plan))
        workdir.parent.mkdir(parents=True, exist_ok=True)
        _git(root, "worktree", "add", "--detach", "--force", str(workdir), plan.commit)
        try:
            restored = _apply_dirty_state(plan, workdir, patch_file, files)
        except BaseException:
            discard(root, workdir)
            raise
    write_marker(workdir, plan)
    return Worktree(workdir, reused=False, restored_files=tuple(restored))


def discard(root: Path, workdir: Path) -> None:
    """Remove a worktree this restore made (a failure after it was made leaves nothing behind)."""
    _git(root, "worktree", "remove", "--force", str(workdir), check=False)
    shutil.rmtree(workdir, ignore_errors=True)
    _git(root, "worktree", "prune", check=False)


def _plan_paths(plan: RestorePlan) -> list[tuple[str, str]]:
    record = {"git": {"untracked": list(plan.untracked)}, "data": list(plan.data)}
    record["inputs"] = list(plan.inputs)
    return _written_paths({**record, "checkpoints": list(plan.checkpoints)})


def _apply_dirty_state(plan: RestorePlan, workdir: Path, patch_file: Path | None,
                       files: Mapping[str, Path]) -> list[str]:  # fmt: skip
    if patch_file is not None:
        out = _git(workdir, "apply", "--binary", "--whitespace=nowarn", str(patch_file), check=False)
        if out.returncode != 0:
            raise RestoreRefused(
                f"the recorded patch does not apply at {plan.commit[:12]}: {out.stderr.strip()[:300]}",
                hint="the commit in this repository differs from the one recorded (rewritten history?)",
            )
        confined.refuse_links_out(workdir, _changed_paths_of(workdir))
    restored = []
    for item in plan.untracked:
        rel = str(item["path"])
        if os.path.lexists(workdir / rel):
            raise RestoreRefused(f"the untracked file {rel} of the record is tracked at {plan.commit[:12]}")
        link = item.get("symlink_target")
        if link is not None:
            confined.make_symlink(workdir, rel, str(link), f"the untracked symlink {rel}")
        else:
            confined.write_file(workdir, rel, files[rel], f"the untracked file {rel}")
        restored.append(rel)
    return restored


def _changed_paths_of(workdir: Path) -> list[str]:
    """Files the patch touched (new ones are untracked in the worktree: the patch is not staged)."""
    out = _git(workdir, "status", "--porcelain", "-z", "--untracked-files=all")
    return [entry[3:] for entry in out.stdout.split("\0") if len(entry) > 3]


def _check_patch_paths(root: Path, patch_file: Path) -> dict[str, str]:
    """Every path the patch writes stays inside; returns the symlinks it makes (path → target)."""
    out = _git(root, "apply", "--numstat", "-z", str(patch_file), check=False)
    if out.returncode != 0:
        raise RestoreRefused(f"the recorded patch cannot be read: {out.stderr.strip()[:300]}")
    for entry in out.stdout.split("\0"):
        path = entry.split("\t")[-1] if "\t" in entry else entry
        if path:
            _safe_path(path, "the recorded patch")
    links = confined.symlinks_in_patch(patch_file.read_bytes())
    for path, target in links.items():
        _safe_link(_safe_path(path, "the recorded patch"), target, "the patch's symlink")
    return links


# -- reuse ---------------------------------------------------------------------------------------
def state_fingerprint(workdir: Path) -> dict[str, Any]:
    """Commit, tracked changes and untracked files of a worktree: what "unchanged" means."""
    state = capture_git(workdir, (".cascade", "mlruns", "mlartifacts", "mlflow.db"), 1 << 62)
    return {
        "commit": state.commit,
        "patch_sha256": state.patch_sha256,
        "untracked": sorted([u.path, u.sha256] for u in state.untracked),
    }


def write_marker(workdir: Path, plan: RestorePlan) -> None:
    marker = _git_dir(workdir) / MARKER
    body = {"run_id": plan.run_id, "version": plan.version, "state": state_fingerprint(workdir)}
    marker.write_text(json.dumps(body, indent=2), encoding="utf-8")


def _remove_rerun_outputs(workdir: Path, plan: RestorePlan, state: Mapping[str, Any]) -> list[str]:
    """Untracked files a previous re-run wrote (unchanged since: the state check passed), so the
    next re-run starts from the recorded state, not from the last one's outputs."""
    recorded = {str(u["path"]) for u in plan.untracked}
    removed = []
    for rel, _digest in state.get("untracked") or []:
        if rel in recorded:
            continue
        path = workdir / _safe_path(str(rel), "a re-run output")
        path.unlink(missing_ok=True)
        removed.append(str(rel))
        parent = path.parent
        while parent != workdir and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return removed


def _check_reusable(root: Path, workdir: Path, plan: RestorePlan) -> Mapping[str, Any]:
    refuse_hint = f"remove it (`git worktree remove --force {workdir}`) or pass --workdir elsewhere"
    marker = _git_dir(workdir) / MARKER if (workdir / ".git").is_file() else None
    if marker is None or not marker.is_file():
        raise RestoreRefused(f"{workdir} exists and is not a cascade restore worktree", hint=refuse_hint)
    recorded = json.loads(marker.read_text(encoding="utf-8"))
    if recorded.get("run_id") != plan.run_id:
        raise RestoreRefused(
            f"{workdir} holds a restore of run {str(recorded.get('run_id'))[:12]}, not {plan.run_id[:12]}",
            hint=refuse_hint,
        )
    now = state_fingerprint(workdir)
    if now != recorded.get("state"):
        changed = _changed_paths(recorded.get("state") or {}, now)
        raise RestoreRefused(
            f"the restore worktree {workdir} was modified since the last restore ({changed})",
            hint="keep your changes elsewhere, then " + refuse_hint,
        )
    return now


def _changed_paths(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    if before.get("commit") != now.get("commit"):
        return f"HEAD moved to {str(now.get('commit'))[:12]}"
    files_before = {p: h for p, h in before.get("untracked") or []}
    files_now = {p: h for p, h in now.get("untracked") or []}
    changed = sorted(p for p in set(files_before) | set(files_now) if files_before.get(p) != files_now.get(p))
    parts = []
    if before.get("patch_sha256") != now.get("patch_sha256"):
        parts.append("tracked files changed")
    if changed:
        parts.append("untracked: " + ", ".join(changed[:5]))
    return "; ".join(parts) or "state differs"


# -- small pieces ----------------------------------------------------------------------------------
def _download(store: RunStore, run_id: str, artifact: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    try:
        return Path(store.download_artifacts(run_id, artifact, str(into)))
    except (CascadeError, OSError, KeyError) as exc:  # a missing artifact, an unreachable store
        said = exc.message if isinstance(exc, CascadeError) else str(exc)
        raise RestoreRefused(
            f"run {run_id[:12]}: the artifact {artifact} cannot be read: {said}",
            hint="the artifact store is incomplete or unreachable from here",
        ) from None


def _check_sha256(path: Path, expected: str, what: str) -> None:
    if sha256_of(path) != expected:
        raise RestoreRefused(
            f"{what} does not match the sha256 in the record (tampered or corrupted artifact)",
            hint="nothing was written; restore from an intact copy of the MLflow artifact store",
        )


def _git_dir(workdir: Path) -> Path:
    out = _git(workdir, "rev-parse", "--absolute-git-dir")
    return Path(out.stdout.strip())


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise RestoreRefused(f"git {' '.join(args[:2])} failed: {out.stderr.strip()[:300]}")
    return out
