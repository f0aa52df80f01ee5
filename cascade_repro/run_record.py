"""The record of one run and its MLflow projection: the manifest built from the plan, what capture
found and what the child said; the tags at start and end; the note the MLflow UI shows; the status."""

from __future__ import annotations

import getpass
import json
import sys
from pathlib import Path
from typing import Any, Mapping

from cascade_repro import __version__
from cascade_repro.capture.environment import environment_read
from cascade_repro.capture.packages import installed_version
from cascade_repro.determinism import script_seeds
from cascade_repro.distributed import JOB_TAG
from cascade_repro.manifest import Manifest
from cascade_repro.params import resolved_dict, used_params
from cascade_repro.record_sections import (
    ContainerSection,
    DataEntry,
    GitSection,
    HardwareSection,
    Outcome,
    PythonSection,
    TorchSection,
)  # fmt: skip
from cascade_repro.redaction import redact_argv
from cascade_repro.run_plan import RunPlan
from cascade_repro.store import spool
from cascade_repro.store.mlflow_store import OpenedRun
from cascade_repro.supervisor import ChildExit


def build_manifest(plan: RunPlan, opened: OpenedRun | None, start_ms: int, run_dir: Path,
                   captured: dict[str, Any], facts: dict[str, Any]) -> Manifest:  # fmt: skip
    """The record from the plan, what capture found and what the child said (`facts`); `opened`
    None: the skeleton a recoverer finds if this process dies before the run opens."""
    system = dict(captured["system"])
    container = system.pop("container")
    torch = facts.get("torch") or {"version": installed_version("torch"), "probed": False}
    determinism = facts.get("determinism") or {"mode": plan.determinism}
    return Manifest(
        run_id=opened.run_id if opened else "",  # "": the skeleton, before the run opens
        experiment=opened.experiment if opened else plan.settings.experiment,
        cascade_version=__version__,
        command={
            "script": plan.script_rel,
            **({"module": plan.module} if plan.module else {}),
            "argv": redact_argv(plan.args),
            "cwd": _relative(plan.cwd, plan.settings.root),
            "interpreter": sys.executable,
            "invocation": redact_argv(plan.invocation),
            "run_name": plan.run_name,
        },
        params=used_params(resolved_dict(plan.params), facts),
        determinism=determinism,
        git=GitSection(captured["git"].to_dict()),
        python=PythonSection(captured["python"]),
        torch=TorchSection(torch),
        hardware=HardwareSection(system),
        environment=captured["environment"],
        container=ContainerSection(container),
        data=DataEntry.each(captured.get("data")),
        environment_read=environment_read(
            facts.get("environment_read") or {}, plan.settings.env_allow_prefixes
        ),
        trace=spool.trace_section(run_dir, facts.get("trace")),
        distributed=plan.distributed.section([]) if plan.distributed else None,
        outcome=Outcome({"status": "RUNNING", "start_time": start_ms / 1000}),
    )


def start_tags(plan: RunPlan) -> dict[str, str]:
    """The run's tags as it opens: MLflow's own keys (the UI shows the source and commit) and cascade.*."""
    tags = {
        "mlflow.source.git.commit": plan.commit,
        "mlflow.source.name": plan.script_rel,
        "mlflow.source.type": "LOCAL",
        "mlflow.user": _user(),
        "cascade.tool_version": __version__,
        "cascade.seed": str(plan.params.seed),
        "cascade.determinism": plan.determinism,
        "cascade.argv": json.dumps(redact_argv(plan.args)),
        "mlflow.note.content": _note(plan),
    }
    if plan.run_name:
        tags["mlflow.runName"] = plan.run_name
    if plan.distributed is not None and plan.distributed.job:  # other nodes' ranks find the run by it
        tags[JOB_TAG] = plan.distributed.job
    return {**tags, **plan.extra_tags}


def end_tags(manifest: Manifest) -> dict[str, str | None]:
    """The tags a finished record adds: the stack and status, searchable in MLflow."""
    torch = manifest.torch
    gpus = manifest.gpus
    return {
        "cascade.torch": torch.version,
        "cascade.cuda": torch.cuda or "none",
        "cascade.cpu_capability": torch.get("cpu_capability"),
        "cascade.gpu": ", ".join(str(g.get("name")) for g in gpus) or "none",
        "cascade.python": manifest.python.version,
        "cascade.status": manifest.outcome.status,
        "cascade.image": manifest.container.image,
        "cascade.image_id": manifest.container.image_id,
    }


def lost_at_the_end(ended: ChildExit, facts: Mapping[str, Any], run_dir: Path,
                    unsaved: str | None) -> list[str]:  # fmt: skip
    """What the record lacks of the script's end, for the run's `outcome.missing` (exit 4): the step
    trace cut short (its header says where and why: a full disk), or the exit facts never written by
    a script that ended by itself while the run directory's disk is full (the parent's own writes
    refused, or no room there now). The checkpoints it noted at its end went with them."""
    lost = spool.trace_cut_short(facts)
    if facts.get("ended_at") or ended.killed_by_signal is not None:
        return lost
    if unsaved or ended.log_error or spool.disk_full(run_dir):
        lost.append("the script's exit facts, never written: the run directory's disk is full (or the script "
                    "ended through os._exit), so what it noted at its end is not recorded (checkpoints it "
                    "saved then, torch's flags, the trace's header)")  # fmt: skip
    return lost


def status_of(ended: ChildExit) -> str:
    """FINISHED, KILLED (a signal, or the codes a shell gives one) or FAILED."""
    if ended.exit_code == 0:  # a script that handled Ctrl-C and finished normally (outcome.signal says so)
        return "FINISHED"
    if (
        ended.signal_received is not None
        or ended.killed_by_signal is not None
        or ended.exit_code in (130, 143)
    ):
        return "KILLED"
    return "FAILED"


def _relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root).as_posix() or "."
    except ValueError:
        return str(path)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _note(plan: RunPlan) -> str:
    args = " ".join(redact_argv(plan.args))
    return (
        f"`cascade run {plan.shown} {args}`".replace(" `", "`")
        + f"\n\nseed {plan.params.seed}, determinism {plan.determinism}, commit {plan.commit[:12]}. "
        "The full record is the artifact cascade/run.json."
    )


def seed_notice(plan: RunPlan, determinism: dict[str, Any]) -> str | None:
    """`--seed N` on a script that seeds itself: which generators it did not decide, and why."""
    taken = script_seeds.overridden(determinism)
    if plan.params.seed_source != "option" or not taken:
        return None
    calls = ", ".join(script_seeds.described(determinism, only=taken)[:6])
    notice = f"--seed {plan.params.seed} had no effect on {script_seeds.words(taken)}: the script seeds "
    notice += f"{'them' if len(taken) > 1 else 'it'} itself ({calls})"
    drawn = {g for call in script_seeds.calls(determinism) or [] for g in call.get("drawn_before") or []}
    for generator in script_seeds.still_governed(determinism):
        notice += f"; {script_seeds.words([generator])} still follows --seed"
        if generator in drawn:
            notice += ": it was drawn from before the script seeded it"
    return notice
