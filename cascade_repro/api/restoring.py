"""`cascade restore`: record → plan → worktree (code, dirty state, data) → re-run → verdict."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from cascade_repro import run_target
from cascade_repro.api.compare import machine_record
from cascade_repro.api.data import fetch_files, not_restorable
from cascade_repro.api.judging import judge_runs, record_verdict
from cascade_repro.api.loading import dvc_cache, load_project
from cascade_repro.api.runs import RunRequest, run
from cascade_repro.determinism.tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from cascade_repro.errors import (
    EXIT_ERROR,
    EXIT_OK,
    CascadeError,
    RestoreRefused,
    StoreError,
    UsageError,
    signal_name,
)
from cascade_repro.manifest import Manifest
from cascade_repro.params import ResolvedParams
from cascade_repro.redaction import fill_argv
from cascade_repro.run_plan import Notify, RunResult
from cascade_repro.settings import Settings
from cascade_repro.store.dvc_store import Cache
from cascade_repro.store.run_store import RunStore

if TYPE_CHECKING:
    from cascade_repro.checkout import Fetched
    from cascade_repro.determinism.trace_file import TraceRecords
    from cascade_repro.determinism.verdict import Verdict
    from cascade_repro.images.prepare import PackageChange, PreparedImage
    from cascade_repro.restore import RestorePlan, Worktree


StepsToSave = tuple[int, int, Path]  # `verify --replay`: the first and last step, and the directory



def shell_word(word: str) -> str:
    """`word` quoted for a POSIX shell; one with a newline or another control character (an argv of a
    record) in bash's $'...', so the command printed on one line is the command pasted."""
    if not any(ord(c) < 32 or ord(c) == 127 for c in word):
        return shlex.quote(word)
    escaped = "".join(_ANSI_C.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c)
                      for c in word)  # fmt: skip
    return f"$'{escaped}'"


_ANSI_C = {"\\": "\\\\", "'": "\\'"}


@dataclass(frozen=True)
class RestoreResult:
    """`cascade restore`: the plan, the worktree it made or reused, the re-run and its verdict
    against the recorded run (both None with --no-run)."""

    plan: RestorePlan
    worktree: Worktree
    run: RunResult | None  # None with --no-run
    verdict: Verdict | None
    image: PreparedImage | None = None  # --docker: the recorded image, or the one rebuilt
    drift: tuple[PackageChange, ...] = ()  # --docker, rebuilt: packages that differ from the record
    store: tuple[str, str] | None = None  # (tracking URI, experiment) the restore read the run from
    interrupted: int | None = None  # the signal (Ctrl-C, SIGTERM) that stopped the re-run: no verdict

    @property
    def rerun_command(self) -> str:
        """--no-run: the shell command that re-runs it by hand, recording into the store and experiment
        the run came from (from the worktree, cascade.yaml's would be a store of the worktree's own)."""
        import shlex

        plan = self.plan
        shell = {slot.variable: f"${{{slot.variable}}}" for slot in plan.secret_args}
        argv, _ = fill_argv(plan.argv, shell)  # redacted values from the variables the plan named

        def quoted(word: str) -> str:  # (a secret's ${VARIABLE} expands: double quotes)
            escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
            return f'"{escaped}"' if "${CASCADE_SECRET_" in word else shell_word(word)

        words = ["cascade", "run", "--seed", str(plan.seed), "--deterministic", plan.determinism,
                 *run_target.words(plan.script, plan.module), *argv]  # fmt: skip
        where = [f"MLFLOW_TRACKING_URI={shlex.quote(self.store[0])}",
                 f"CASCADE_EXPERIMENT={shlex.quote(self.store[1])}"] if self.store else []  # fmt: skip
        return f"cd {shell_word(str(self.worktree.path / plan.cwd))} && " + " ".join(
            [*where, *map(quoted, words)])

    @property
    def reproduced(self) -> bool:
        return self.verdict is not None and self.verdict.reproduced

    @property
    def exit_status(self) -> int:
        """`cascade restore`'s exit code: 0 reproduced (or only materialized, --no-run), 3 not
        reproduced, 128 + N a re-run the user stopped (130: Ctrl-C), 1 a re-run with no verdict."""
        if self.interrupted is not None:
            return 128 + self.interrupted
        if self.verdict is None:
            return EXIT_OK if self.run is None else EXIT_ERROR
        return self.verdict.exit_status


def restore(
    ref: str,
    cwd: Path | None = None,
    workdir: Path | None = None,
    steps: int | None = None,
    execute: bool = True,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    notify: Notify = lambda message: None,
    show_plan: Callable[[RestorePlan], None] = lambda plan: None,
    docker: bool = False,
    gpus: str | None = None,
    dump: StepsToSave | None = None,
) -> RestoreResult:
    """Rebuild a recorded run in an isolated worktree, re-run it, and judge the new trace against it.

    `dump` (first, last, directory): the re-run saves those steps' tensors there (`cascade verify
    --replay`; child/trace_dump.py).
    """
    from cascade_repro import restore as restoring

    settings = load_project(cwd)
    root = settings.root
    # The embedded store is read without MLflow (fast=True), whose import would delay the script by
    # ~1.5 s; the recorder imports it anyway while the script starts.
    store = RunStore.open(settings)
    found = store.resolve(ref, fast=True)
    run_id, version = found.run_id, found.version
    manifest = store.record(run_id)
    if steps is not None and steps < 1:
        raise UsageError("--steps must be a positive number of optimizer steps")
    if steps is not None and not manifest.trace_header.get("steps"):
        raise UsageError(f"run {run_id[:12]} has no step trace, so --steps has nothing to compare")
    recorded = None  # the run's trace, where read already (not read twice)
    if steps is None:
        steps, recorded = _steps_a_killed_run_ran(store, manifest)
        if steps is not None:
            notify(f"the recorded run {_how_it_stopped(manifest)} after {steps} steps: re-running those "
                   "(--steps N re-runs another number)")  # fmt: skip
    label = (version or run_id[:12]).replace("/", "_")
    workdir = (workdir or settings.paths.restores / label).absolute()
    plan = restoring.plan_restore(manifest, version, workdir, steps, os.environ, settings.env_allow_prefixes,
                                  machine_record(settings, os.environ, probe_torch=False))  # fmt: skip
    plan = restoring.locate_inputs(plan, root, settings.paths.restores)
    show_plan(plan)
    unrecorded = manifest.outcome.get("inputs_not_recorded")
    if isinstance(unrecorded, int) and unrecorded > 0:  # (past the record's 10,000)
        notify(f"warning: the run read {unrecorded} more input file(s) than its record holds: the re-run "
               "does not get them from the record (it reads them from the worktree, if anything puts them "
               "there); track their directory with `dvc add DIR` next time")  # fmt: skip
    _refuse_what_cannot_run(plan, execute)  # before anything is written
    with _only_restore_of(plan.workdir, settings, notify):  # another restore meanwhile is told, not broken
        tree = _materialize(plan, manifest, settings, store, execute, notify)
        if not execute:
            return RestoreResult(plan, tree, None, None, store=(settings.tracking_uri, plan.experiment))
        _refuse_another_module(plan, tree.path, root)
        image, drift = (
            (None, []) if not docker else _restore_image(store, manifest, plan, tree.path, settings, notify)
        )
        request = _rerun_request(plan, manifest, tree.path, settings, label, dump)
        if docker:  # the recorded shared memory (DataLoader workers need it); GPUs follow this machine (auto)
            shm_size = manifest.container.shm_size
            tags = {**(request.extra_tags or {}), **_image_tags(image, drift)}
            request = replace(request, docker=True, gpus=gpus, image=image, shm_size=shm_size,
                              extra_tags=tags)
        notify(f"re-running {' '.join((plan.shown, *plan.argv))} in {tree.path}")
        restoring.write_marker(tree.path, plan, rerun="started")  # killed during it: reusable still
        result = run(request, notify)
        restoring.write_marker(tree.path, plan, rerun="ended")  # its outputs: the state reuse expects
        stopped = result.signal_received  # (a re-run killed by the OOM killer, a segfault: judged)
        if stopped is not None:  # the user's Ctrl-C (SIGTERM) to this restore: an abort, nothing to judge
            notify(f"the re-run was interrupted ({signal_name(stopped)}): no verdict; `cascade restore "
                   f"{ref}` re-runs it (the worktree is reused)")  # fmt: skip
            return RestoreResult(plan, tree, result, None, image, tuple(drift), interrupted=stopped)
        verdict = judge_runs(store, manifest, result.manifest, rtol, atol, steps=steps, trace_a=recorded)
        verdict = _crash_told(verdict, store, manifest, result)
        record_verdict(store, verdict, result.run_id, run_id)
        return RestoreResult(plan, tree, result, verdict, image, tuple(drift))


# A killed restore's re-run is told to stop (SIGTERM); its script's own clean-up is waited for this long.
KILLED_RERUN_WAIT_S = 60.0


@contextlib.contextmanager
def _only_restore_of(workdir: Path, settings: Settings, notify: Notify) -> Iterator[None]:
    """Hold the worktree `workdir` for this restore: another one into it at the same time (the same
    version restored twice at once) is refused with who holds it, before it writes anything. The
    lock is the project's (`.cascade/locks/`), by the worktree's real path, wherever that is. A
    killed restore's re-run that has not stopped yet is waited for (`_no_rerun_left_in`)."""
    import hashlib

    locks = settings.paths.own / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    where = os.path.realpath(workdir)  # one lock however the path is spelled (../w, a symlink)
    lock_path = locks / (hashlib.sha256(where.encode()).hexdigest()[:16] + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            raise CascadeError(
                f"another cascade restore is using {workdir} (pid {holder})",
                hint="wait for it to end, or restore into another directory: --workdir DIR",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _no_rerun_left_in(workdir, notify)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _no_rerun_left_in(workdir: Path, notify: Notify) -> None:
    """A restore killed during its re-run let go of the worktree's lock, but its re-run, told to stop
    (SIGTERM), may still be cleaning up, writing in the worktree: waited for, up to KILLED_RERUN_WAIT_S,
    by the run directory it owns (its pid and start time: a reused pid is not it), then refused."""
    from cascade_repro.settings import ProjectPaths
    from cascade_repro.store import spool

    runs = ProjectPaths(workdir).runs  # (the re-run's project is the worktree)
    deadline = time.monotonic() + KILLED_RERUN_WAIT_S
    told = False
    while True:
        running = [run_dir for run_dir in spool.run_dirs(runs) if spool.owner_alive(run_dir)]
        if not running:
            return
        owner = spool.read_json(running[0] / spool.OWNER_FILE) or {}
        pid = owner.get("child_pid") or owner.get("pid") or "?"
        if time.monotonic() > deadline:
            raise CascadeError(
                f"the re-run of an earlier cascade restore still runs in {workdir} (pid {pid})",
                hint=f"wait for it to end or stop it (kill {pid}), or restore elsewhere: --workdir DIR",
            )
        if not told:
            notify(f"waiting for the re-run of an earlier cascade restore (pid {pid}) to stop: it still runs "
                   "in the worktree")  # fmt: skip
            told = True
        time.sleep(0.2)


def _steps_a_killed_run_ran(store: RunStore, manifest: Manifest) -> tuple[int | None, TraceRecords | None]:
    """A run stopped from outside (Ctrl-C, SIGTERM, its parent lost) ended at a step nothing in the
    script chose, KILLED or, where the script caught the signal and ended cleanly (pytorch/examples'
    "Exiting from training early"), with the signal recorded: the re-run stops there too, and the
    verdict is about the steps it ended (a step it was inside, a closure's, is not re-run: its update
    may not have run); and its trace, read for that."""
    from cascade_repro.api.judging import trace_records
    from cascade_repro.determinism.trace_file import steps_ended

    outcome = manifest.outcome
    stopped = outcome.status == "KILLED" or outcome.signal is not None
    if not stopped or not manifest.trace_header.get("steps"):
        return None, None
    records = trace_records(store, manifest.run_id, manifest.trace_header.get("artifact"))
    ran = steps_ended(records)
    return (ran if ran > 0 else None), records


def _how_it_stopped(manifest: Manifest) -> str:
    number = manifest.outcome.signal
    if manifest.outcome.status == "KILLED" or number is None:
        return "was KILLED"
    return f"stopped on {signal_name(number)} (the script ended itself, {manifest.outcome.status})"


def _refuse_what_cannot_run(plan: RestorePlan, execute: bool) -> None:
    """Untracked files the record did not keep, inputs not here as the run read them, and (to re-run)
    secrets not set: each refused before anything is written."""
    from cascade_repro import restore as restoring

    if plan.unavailable:
        raise RestoreRefused(
            f"the record names untracked files it did not keep: {', '.join(plan.unavailable[:5])}",
            hint="they were larger than untracked_max_bytes; track such files with `dvc add` next time",
        )
    not_here = restoring.missing_inputs_said(plan.inputs, plan.input_sources)
    if not_here is not None:  # a re-run without them would only crash
        message, fix = not_here
        raise RestoreRefused(message, hint=fix)
    if execute and plan.secrets_missing:
        raise RestoreRefused(
            f"the recorded command has {len(plan.secret_args)} redacted value(s); set "
            + ", ".join(plan.secrets_missing)
            + " to re-run it",
            hint="export each variable with the secret's value (or restore with --no-run)",
        )


def _materialize(plan: RestorePlan, manifest: Manifest, settings: Settings, store: RunStore,
                 execute: bool, notify: Notify) -> Worktree:  # fmt: skip
    """The worktree with the recorded data, checkpoints and inputs in it: every DVC object fetched and
    verified before the worktree is made; a worktree made here is removed again if that fails."""
    from cascade_repro import restore as restoring

    root = settings.root
    wanted = _restore_objects(plan, manifest, execute)
    for path in not_restorable(manifest):  # (a re-run reads what the worktree has there, if anything)
        notify(f"not restored: {path}: the record has no copy of the bytes the run read")
    cache = dvc_cache(root) if wanted or Cache.exists_for(root) else None
    try:
        fetched = []  # a directory's files each, its listing's paths checked (untrusted: a shared remote)
        for path, md5 in wanted:
            assert cache is not None  # (opened whenever something is wanted)
            fetched += [item for _, item in fetch_files(cache, path, md5, settings.dvc_remote)]
        tree = restoring.materialize(plan, root, store, notify)
        try:
            if cache is not None and Cache.exists_for(tree.path) and not tree.reused:
                cache.share_with(tree.path)  # the re-run's checkpoints go to this cache and remote
            for item in fetched:  # verified before the worktree was made; copied in now
                _deliver(item, tree)
            copied = restoring.deliver_inputs(plan, root, tree.path, settings.paths.restores)
            restoring.reach_outside(root, tree.path, notify)
        except BaseException:
            if not tree.reused:
                restoring.discard(root, tree.path)
            raise
    finally:
        if cache is not None:
            cache.close()
    if fetched:
        notify(
            f"restored {len(fetched)} file(s) of {len(wanted)} DVC object(s) into the worktree, md5-verified"
        )
    if copied:
        again = sum(plan.input_sources.get(rel, "").startswith(restoring.RESTORED) for rel in copied)
        where = f"an earlier restore's worktree ({again}) and your checkout" if again else "your checkout"
        where = "an earlier restore's worktree" if again == len(copied) else where
        notify(f"copied {len(copied)} input file(s) from {where} into the worktree, sha256-verified")
    return tree


def _refuse_another_module(plan: RestorePlan, tree: Path, root: Path) -> None:
    """A run of `-m NAME` re-runs by its name: what `python -m NAME` finds from the worktree must be
    the file the record names (in the worktree, or at the same path in the checkout: an editable
    install, which the re-run maps to the worktree). A record from elsewhere that names another
    module (`pip`, with its arguments) would have the restore run code that is not the project's."""
    if plan.module is None:
        return
    try:
        found = run_target.module_file(plan.module, tree / plan.cwd)
    except run_target.NotRunnable as exc:
        raise RestoreRefused(f"run {plan.run_id[:12]} ran `-m {plan.module}`, which the restored code cannot "
                             f"run: {exc}") from None  # fmt: skip
    if found not in {(tree / plan.script).resolve(), (root / plan.script).resolve()}:
        raise RestoreRefused(
            f"run {plan.run_id[:12]} records `-m {plan.module}` as {plan.script}, but from the restored code "
            f"it runs {found}: that is not the project's code, and is not run",
            hint="restore only records made by `cascade run`; `cascade show RUN` shows the command it "
            "records",
        )


def _image_tags(image: PreparedImage | None, drift: Sequence[PackageChange]) -> dict[str, str]:
    if image is None:
        return {}
    return {
        "cascade.image_source": "recorded" if image.reused_by_id else "rebuilt",
        "cascade.image_drift": ", ".join(str(c) for c in drift)[:5000] or "none",
    }


def _rerun_request(plan: RestorePlan, manifest: Manifest, tree: Path, settings: Settings, label: str,
                   dump: StepsToSave | None) -> RunRequest:  # fmt: skip
    """The recorded command, run in the worktree with the recorded params, environment and world size."""
    return RunRequest(
        script=str(tree / plan.script),
        module=plan.module,
        args=tuple(fill_argv(plan.argv, os.environ)[0]),
        cwd=tree / plan.cwd,
        determinism=plan.determinism,
        run_name=f"restore-{label}",
        experiment=plan.experiment,
        trace_interval=plan.trace_interval,
        trace_budget=0.0 if dump else plan.trace_budget,  # a replay reads every facet at every step
        trace_schedule=None if dump else plan.trace_schedule,
        trace_records=None if dump else plan.trace_records,
        nproc_per_node=plan.nproc_per_node,
        environ=_restore_environ(plan, settings, dump),
        restored_params=_recorded_params(manifest),
        extra_tags={
            "cascade.restored_from": plan.run_id,
            **({"cascade.restored_version": plan.version} if plan.version else {}),
        },
        docker=False,  # in a container only with `restore --docker`, whatever cascade.yaml says
        # (the inputs it kept in the DVC cache are kept by the re-run too, not warned about as loose)
        track_inputs=_recorded_flag(manifest.command.get("invocation"), "--track-inputs"),
    )


# `cascade run`'s options that take a value (api/runs.py `_invocation_options` writes them before the script)
_VALUED_OPTIONS = ("--set", "--add", "--params", "--seed", "--deterministic", "--name", "--tag", "--gpus",
                   "--shm-size", "--nproc-per-node")  # fmt: skip


def _recorded_flag(invocation: Any, flag: str) -> bool:
    """Whether the recorded `cascade run` invocation (untrusted: a list of str, or not) had `flag` among
    cascade's own options, before the script: never one of the script's arguments."""
    if not isinstance(invocation, list) or invocation[:2] != ["cascade", "run"]:
        return False
    words = iter(invocation[2:])
    for word in words:
        if not isinstance(word, str) or not word.startswith("--"):
            return False  # the script: its arguments are its own
        if word == flag:
            return True
        if word in _VALUED_OPTIONS:
            next(words, None)
    return False


CRASH_LINES = 12  # of the re-run's output, in the verdict of a re-run that crashed


def _crash_told(verdict: Verdict, store: RunStore, manifest: Manifest, result: RunResult) -> Verdict:
    """A re-run that crashed (the recorded run did not) is reported as that: its status, exit code,
    exception and last lines of output, not as whatever its shorter trace looks like."""
    from dataclasses import replace

    from cascade_repro.determinism.verdict import DIVERGED, crashed

    ended = crashed(result.manifest)
    if ended is None or crashed(manifest) is not None or verdict.verdict == DIVERGED:
        return verdict
    summary = f"the re-run {ended}"
    if verdict.comparison.compared:
        summary += f" after {verdict.comparison.compared} step(s), bitwise identical to the recorded ones"
    try:
        text = store.text(result.run_id, "cascade/output.log")
    except StoreError:
        text = ""
    lines = _without_our_frames([line for line in text.splitlines() if line.strip()])[-CRASH_LINES:]
    if lines:
        summary += "; its last lines:\n" + "\n".join(f"  | {line}" for line in lines)
    return replace(verdict, summary=summary)


def _without_our_frames(lines: list[str]) -> list[str]:
    """The output without the traceback frames of cascade's bootstrap and runpy (they run every
    script and say nothing about this one), so the last lines are the script's own."""
    out: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith("  File "):
            skipping = "<frozen runpy>" in line or "/cascade_repro/child/" in line or "/runpy.py" in line
            if skipping:
                continue
        elif skipping and line.startswith("    "):
            continue  # the source line (and carets) of a skipped frame
        else:
            skipping = False
        out.append(line)
    return out


def _restore_image(
    store: RunStore,
    manifest: Manifest,
    plan: RestorePlan,
    tree: Path,
    settings: Settings,
    notify: Notify,
) -> tuple[PreparedImage, list[PackageChange]]:
    """The recorded image when this engine has it (0 builds); else one rebuilt from the recorded
    Dockerfile and requirements over the restored code, with its package drift reported before the run."""
    from cascade_repro.images import context, engine, prepare
    from cascade_repro.run_engine import image_cache_dir, own_paths

    container = manifest.container
    docker = engine.connect()
    dockerfile = requirements = None
    if container.in_docker:
        dockerfile = _artifact_text(
            store, plan.run_id, str(container.get("dockerfile_artifact") or "cascade/Dockerfile")
        )
        requirements = _artifact_text(
            store, plan.run_id, str(container.get("requirements_artifact") or "cascade/requirements.txt")
        )
        found = prepare.recorded_image(docker, container.raw, dockerfile or "", requirements or "")
        if found is not None:
            notify(f"image: the recorded {found.image.tag} ({found.image.image_id[7:19]}) is here: no build")
            return found, []
        source = (
            "the recorded Dockerfile" if dockerfile else "the current template (the record has no Dockerfile)"
        )
        notify(
            f"image: the recorded {container.image} ({str(container.image_id)[7:19]}) is "
            f"not on this engine: rebuilding it from {source}"
        )
    else:
        notify(
            "image: the run was not recorded in Docker: building the project's image for the restored code"
        )
    recorded_packages = manifest.python.packages
    reqs = context.Requirements(requirements, "recorded") if requirements else None
    prepared = prepare.prepare_image(
        docker,
        tree,
        context.docker_settings(settings.docker, settings.root),
        plan.experiment,
        plan.commit,
        plan.dirty,
        recorded_packages,
        settings.paths.builds,
        notify,
        dockerfile=dockerfile or None,
        requirements=reqs,
        base_image=container.get("base_image") if dockerfile else None,
        exclude=own_paths(settings),
    )
    if not recorded_packages:
        notify("image drift: unknown (the record has no package list to compare with)")
        return prepared, []
    now = engine.probe_python(docker, prepared.image.image_id, image_cache_dir())
    drift = prepare.package_drift(recorded_packages, now.get("packages") or {})
    if drift:
        notify(
            f"image drift: {len(drift)} package(s) differ from the record: "
            + ", ".join(str(c) for c in drift[:8])
            + (" ..." if len(drift) > 8 else "")
        )
    else:
        notify("image drift: none (the rebuilt image has the recorded packages)")
    return prepared, drift


def _artifact_text(store: RunStore, run_id: str, path: str) -> str | None:
    """A recorded text artifact, or None when the record has none."""
    try:
        return store.text(run_id, path)
    except StoreError:
        return None


def _deliver(item: Fetched, tree: Worktree) -> None:
    """A verified object into the worktree: a file there with other bytes (a worktree reused after a
    re-run that wrote another version) is refused, saying how to start afresh."""
    from cascade_repro import checkout as checking

    try:
        checking.deliver(item, tree.path, item.path, force=False)
    except UsageError as exc:
        raise RestoreRefused(
            f"the restore worktree {tree.path} already has {item.path} with other bytes than the run's "
            f"({exc.message})",
            hint=f"remove it (`git worktree remove --force {tree.path}`) or restore with --workdir NEW_DIR",
        ) from None


def _restore_objects(plan: RestorePlan, manifest: Manifest, execute: bool) -> list[tuple[str, str]]:
    """The data the run read; with --no-run also its kept checkpoints (a re-run starts without them,
    as the original did)."""
    wanted = manifest.data_objects
    wanted += [(i.path, str(i.md5)) for i in plan.inputs if i.md5]  # --track-inputs
    if not execute:  # each path as the run left it: its last version (a best-only file saved again)
        last = {c.path: str(c.md5) for c in manifest.kept_checkpoints if not os.path.isabs(c.path)}
        # one the run read first (a resume checkpoint saved over) stays as read: the re-run starts there
        read = {os.path.normpath(i.path) for i in plan.inputs}
        wanted += [(path, md5) for path, md5 in last.items() if os.path.normpath(path) not in read]
    return wanted


def _recorded_params(manifest: Manifest) -> ResolvedParams:
    """The params file as the run resolved it (`params.file`; a record before issue 14.2 has only
    `values` and `source`), so that `cascade_repro.params()` returns the same in the re-run."""
    params = manifest.params
    if "file" in params:
        file = params["file"] or {}  # null: the run had no params file
    else:
        file = {"values": params.get("values"), "path": params.get("source")}
    return ResolvedParams(
        values=dict(file.get("values") or {}),
        source=file.get("path"),
        overrides=dict(params.get("overrides") or {}),
        seed=int(params.get("seed", 0)),
        seed_source="restored",
    )


def _restore_environ(plan: RestorePlan, settings: Settings, dump: StepsToSave | None) -> dict[str, str]:
    """This machine's environment with the record's allow-listed variables, writing to this store."""
    from cascade_repro.child import protocol
    from cascade_repro.child.restored_code import restored_code_value

    environ = dict(os.environ)
    for name, value in plan.environment.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        environ.pop(name, None)  # the re-run is a new run of the recorded experiment
    for slot in plan.secret_args:
        environ.pop(slot.variable, None)  # in the script's argv already
    environ["MLFLOW_TRACKING_URI"] = settings.tracking_uri
    if plan.steps is not None:
        environ[protocol.ENV_STOP_AFTER] = str(plan.steps)
    if dump is not None:
        environ[protocol.ENV_TRACE_DUMP] = f"{dump[0]}:{dump[1]}:{dump[2]}"
    if plan.num_threads:
        environ[protocol.ENV_NUM_THREADS] = str(plan.num_threads)
    # the project's own modules, where an editable install or PYTHONPATH finds them in this checkout
    environ[protocol.ENV_RESTORED_CODE] = restored_code_value(str(settings.root), str(plan.workdir),
                                                                  str(settings.paths.own))
    return environ
