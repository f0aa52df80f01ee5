"""`cascade diff` and `cascade check`: two records (or this machine, "current") compared."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from cascade_repro.api.judging import judge_runs
from cascade_repro.api.loading import load_project
from cascade_repro.check import CheckReport, Finding, check_against, check_machine
from cascade_repro.determinism.tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from cascade_repro.diff import SECTIONS, Diff, diff_records
from cascade_repro.errors import CascadeError, UsageError
from cascade_repro.manifest import Manifest
from cascade_repro.record_sections import (
    ContainerSection,
    DataEntry,
    FileEntry,
    GitSection,
    HardwareSection,
    PythonSection,
    TorchSection,
)  # fmt: skip
from cascade_repro.settings import Settings
from cascade_repro.store import git_repo
from cascade_repro.store.run_store import RunStore

CURRENT = "current"
RESULT_SECTIONS = ("metrics", "checkpoints", "trace")  # what only a run has
MAX_INPUTS_HASHED = 1000  # of a run's inputs, hashed here to compare against `current`
TORCH_PROBE = (
    "import json, torch\n"
    "from cascade_repro.child.torch_probe import torch_stack\n"
    "print(json.dumps(torch_stack(torch), default=str))\n"
)


def diff(ref_a: str, ref_b: str, only: tuple[str, ...] = (), cwd: Path | None = None,
         log_to: str | None = None) -> Diff:  # fmt: skip
    """What differs between two runs (ids, names, versions, or "current": this machine and tree).

    `current` has run nothing: results (metrics, checkpoints, trace) are not compared against it."""
    settings = load_project(cwd)
    against_current = CURRENT in (ref_a, ref_b)
    if against_current:
        asked = [name for name in only if name in RESULT_SECTIONS]
        if asked:
            raise UsageError(
                f"{', '.join(asked)}: results are not compared against `current`, which has run nothing",
                hint="compare two recorded runs, or leave those sections out",
            )
        only = only or tuple(name for name in SECTIONS if name not in RESULT_SECTIONS)
    store = None
    records: list[Manifest] = []
    latest: list[dict[str, float]] = []
    for ref in (ref_a, ref_b):
        if ref == CURRENT:
            records.append(current_record(settings))
            latest.append({})
            continue
        store = store or RunStore.open(settings, fast_reads=True)
        found = store.resolve(ref)
        records.append(store.record(found.run_id))
        latest.append(dict(found.metrics))  # (with those a framework's own MLflow logger wrote)
    if against_current and len(records) == 2:  # the run's inputs, as they are here now
        at = 0 if ref_a == CURRENT else 1
        records[at] = replace(records[at], inputs=_inputs_here(settings.root, records[1 - at].inputs))
    a, b = records
    trace_note = None
    both_traced = all(m.trace_header.get("steps") for m in (a, b))
    if store is not None and both_traced and (not only or "trace" in only):
        verdict = judge_runs(store, a, b, DEFAULT_RTOL, DEFAULT_ATOL)
        summary = verdict.summary
        trace_note = summary if summary.startswith(verdict.verdict) else f"{verdict.verdict}: {summary}"
    try:
        result = diff_records(a, b, only, _code_stat(settings.root, a, b), trace_note, (latest[0], latest[1]))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if against_current:
        results = ", ".join(RESULT_SECTIONS)
        note = f"results ({results}) are not compared against `current`: it has run nothing"
        result = replace(result, notes=(*result.notes, note))
    if log_to is not None:
        store = store or RunStore.open(settings, fast_reads=True)
        name = f"cascade/diff/{result.run_a[:12]}-{result.run_b[:12]}.json"
        store.log_json(store.resolve(log_to).run_id, result.to_dict(), name)
    return result


def check(ref: str | None = None, cwd: Path | None = None) -> CheckReport:
    """Against a run: can this machine reproduce it bit for bit? Without: is cascade set up here?"""
    settings = load_project(cwd)
    if ref is None:
        return check_machine(_machine_probes(settings))
    from cascade_repro.restore.inputs import input_sources, missing_inputs_said

    store = RunStore.open(settings)
    record = store.record(store.resolve(ref).run_id)
    not_here = missing_inputs_said(record.inputs, input_sources(record.inputs, settings.root,
                                                                 settings.paths.restores))
    # (inputs restore would refuse to re-run without: not runnable here either)
    more = [Finding("not_runnable", *not_here)] if not_here is not None else []
    return check_against(record, current_record(settings), more)


def _inputs_here(root: Path, recorded: Sequence[FileEntry]) -> tuple[FileEntry, ...]:
    """The files a run read that neither git nor DVC tracks, hashed as they are in this checkout now
    (`current` ran nothing, so it read nothing: without this each was "removed"). A path the record
    names that is not a regular file inside the checkout is missing here."""
    from cascade_repro.capture.files import regular_inside
    from cascade_repro.file_hashes import FileHashes

    here = []
    hashes = FileHashes(root)
    for entry in recorded[:MAX_INPUTS_HASHED]:
        if regular_inside(root, entry.path):
            digest, size = hashes.sha256_and_size(root / entry.path)
            here.append(FileEntry.of({"path": entry.path, "size": size, "sha256": digest}))
    hashes.save()
    return tuple(here)


def current_record(settings: Settings) -> Manifest:
    """A record of this machine and working tree, made without running anything."""
    from cascade_repro.capture import earlier_outputs
    from cascade_repro.capture.git import capture_git
    from cascade_repro.params import find_params_file, resolve_params
    from cascade_repro.run_engine import own_paths

    root = settings.root
    params_file = find_params_file(root, root / "train.py", None, settings.params_file)
    params = resolve_params(params_file, root)
    machine = machine_record(settings, os.environ, probe_torch=True)
    return replace(
        machine,
        run_id=CURRENT,
        params={
            "values": params.values,
            "seed": params.seed,
            "file": {"path": params.source, "values": params.values} if params.source else None,
        },
        determinism={"mode": settings.determinism},
        # (the files earlier runs wrote are left out, as the next run's capture leaves them out)
        git=GitSection(capture_git(root, own_paths(settings), settings.untracked_max_bytes,
                                   earlier=earlier_outputs.load(root)).to_dict()),  # fmt: skip
        data=DataEntry.each(_data_here(root)),
    )


def machine_record(settings: Settings, environ: Mapping[str, str], probe_torch: bool) -> Manifest:
    """This machine as a record that ran nothing: its torch, python, hardware, environment, container.

    `probe_torch`: torch's full stack from a subprocess (~1.5 s); else only its installed version.
    """
    from cascade_repro.capture.environment import capture_environment
    from cascade_repro.capture.packages import capture_python, installed_version
    from cascade_repro.capture.system import capture_system

    hardware = capture_system(environ)
    container = hardware.pop("container", {})
    return Manifest(
        "this machine",
        settings.experiment,
        python=PythonSection(capture_python()),
        torch=TorchSection(_torch_here() if probe_torch else {"version": installed_version("torch")}),
        hardware=HardwareSection(hardware),
        environment=capture_environment(environ, settings.env_allow_prefixes),
        container=ContainerSection(container),
    )


def _torch_here() -> dict[str, Any]:
    """torch's stack as `cascade run` would record it, probed in a subprocess (no import here)."""
    out = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {}
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {}


def _data_here(root: Path) -> list[dict[str, Any]]:
    from cascade_repro.capture.data import tracked_data

    try:
        return tracked_data(root, hash_modified=True)
    except CascadeError:  # a broken DVC repo: `current` still describes the rest
        return []


def _code_stat(root: Path, a: Manifest, b: Manifest) -> str | None:
    commits = [m.git.commit or "" for m in (a, b)]
    if not all(git_repo.is_commit_id(c) for c in commits) or commits[0] == commits[1]:
        return None
    out = git_repo.run(root, "diff", "--stat", "--end-of-options", commits[0], commits[1])
    if out.returncode != 0:
        return "(a commit is not in this repository: git fetch it)"
    # one line, as a note is shown: "README.md | 1 +; 1 file changed, 1 insertion(+)" (its lines joined:
    # a table cell printed the newline as a literal \n)
    lines = out.stdout.decode(errors="replace").splitlines()
    return "; ".join(" ".join(line.split()) for line in lines if line.strip())


def _machine_probes(settings: Settings) -> dict[str, tuple[bool, str, str]]:
    from cascade_repro.store.dvc_store import Cache
    from cascade_repro.store.git_repo import head_commit

    probes: dict[str, tuple[bool, str, str]] = {}
    root = settings.root
    try:
        probes["git"] = (True, f"{root} at {head_commit(root)[:12]}", "")
    except CascadeError as exc:
        probes["git"] = (False, exc.message, exc.hint or "commit your code")
    config = (root / "cascade.yaml").is_file()
    probes["cascade.yaml"] = (
        config,
        "present" if config else "missing (defaults apply)",
        "run `cascade init`",
    )
    try:
        RunStore.open(settings).experiment_id()
        probes["MLflow store"] = (True, settings.tracking_uri, "")
    except Exception as exc:
        probes["MLflow store"] = (False, f"{settings.tracking_uri}: {exc}".splitlines()[0],
                                  "start the server or fix MLFLOW_TRACKING_URI / tracking_uri")  # fmt: skip
    if Cache.exists_for(root):
        cache = Cache(root)
        try:
            remote = settings.dvc_remote or cache.default_remote()
            remotes = dict(cache.repo().config["remote"])
            url = str((remotes.get(remote) or {}).get("url") or "") if remote else ""
            reachable = bool(url) and ("://" in url or Path(url).is_dir())
            fix = "run `cascade init` for a local remote, or `dvc remote add -d NAME URL`"
            probes["DVC remote"] = (reachable, f"{remote or '(none)'} → {url or '(no url)'}", fix)
        finally:
            cache.close()
    else:
        probes["DVC"] = (False, "not a DVC repository", "run `cascade init` (it runs `dvc init`)")
    from cascade_repro.capture.system import capture_gpus

    torch = _torch_here()
    gpus = [g for g in capture_gpus() if isinstance(g, dict)]
    cuda = torch.get("cuda") or "none"
    probes["torch"] = (
        bool(torch),
        f"{torch.get('version')} (CUDA {cuda}, cuda available: {torch.get('cuda_available')})"
        if torch
        else "not installed",
        "pip install torch",
    )
    probes["GPUs"] = (
        True,
        ", ".join(str(g.get("name")) for g in gpus) if gpus else "none visible (CPU runs)",
        "",
    )
    if settings.docker.get("enabled"):
        from cascade_repro.images.engine import engine_answers

        ok = engine_answers()
        probes["Docker"] = (ok, "engine answers" if ok else "no engine answers",
                            "start Docker (dockerd) or set docker.enabled: false")  # fmt: skip
    probes["python"] = (True, f"{platform.python_version()} ({sys.executable})", "")
    return probes
