"""What `restore`, `checkout` and `push` print: the plan before anything heavy, then the result."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping

from cascade_repro.render.console import emit_json, notice
from cascade_repro.render.runs import run_result
from cascade_repro.render.verdicts import verdict

if TYPE_CHECKING:
    from cascade_repro.api.data import CheckoutResult, PushSummary
    from cascade_repro.api.restoring import RestoreResult
    from cascade_repro.restore import RestorePlan


def restore_plan(plan: RestorePlan) -> None:
    """Printed before anything heavy happens (stderr: stdout stays for the verdict)."""
    what = f"{plan.version} (run {plan.run_id[:12]})" if plan.version else f"run {plan.run_id[:12]}"
    notice(f"restore plan for {what}, experiment {plan.experiment}")
    patch = plan.patch
    notice(
        f"  code       commit {plan.commit[:12]}"
        + (f" + patch of {patch.get('size')} bytes" if patch else "")
    )
    if plan.untracked:
        names = ", ".join(u.path for u in plan.untracked[:5])
        notice(f"  untracked  {len(plan.untracked)} file(s), sha256-checked: {names}")
    notice(f"  data       {len(plan.data)} DVC object(s); checkpoints {len(plan.checkpoints)}")
    for line in _plan_inputs(plan.input_sources):
        notice(f"  inputs     {line}")
    if plan.read_outside_count:
        more = plan.read_outside_count - len(plan.read_outside)
        named = ", ".join(plan.read_outside[:5]) + (f" and {more} more" if more > 0 else "")
        notice(f"  outside    {plan.read_outside_count} file(s) read outside the repository, not recorded: "
               f"the re-run reads them as they are here: {named}")  # fmt: skip
    command = " ".join((plan.shown, *plan.argv))
    notice(f"  command    {command} (cwd {plan.cwd}), seed {plan.seed}, determinism {plan.determinism}"
           + (f", first {plan.steps} steps" if plan.steps else ""))  # fmt: skip
    if plan.num_threads:
        notice(f"  threads    torch.set_num_threads({plan.num_threads}), as recorded")
    for name, value in plan.environment.items():
        notice(f"  env        {name}={value}" if value is not None else f"  env        unset {name}")
    for slot in plan.secret_args:
        state = "NOT SET: set it to re-run" if slot.variable in plan.secrets_missing else "set"
        notice(f"  secret     {slot.option}: redacted in the record, taken from ${slot.variable} ({state})")
    for name, here in plan.secret_env.items():
        state = "" if here else " (not set here: the re-run goes without it)"
        notice(f"  secret     {name}: redacted in the record, this machine's value{state}")
    for difference in plan.differences:
        meaning = "bitwise not expected here" if difference.klass == "A" else "fixed by restore"
        notice(f"  machine    class {difference.klass}: {difference.summary} ({meaning})")
    notice(f"  worktree   {plan.workdir}")


def _plan_inputs(sources: Mapping[str, str]) -> list[str]:
    """Where the files the run read that neither git nor DVC tracked come from, one line per source."""
    by: dict[str, list[str]] = {}
    for path, source in sources.items():
        by.setdefault(source, []).append(path)
    words = {
        "checkout": "neither git nor DVC tracks, taken from your checkout (sha256-verified)",
        "dvc": "kept in the DVC cache (--track-inputs, or as read before the run rewrote or removed "
               "them), from there (md5-verified)",
        "missing": "NOT in your checkout",
        "changed": "CHANGED in your checkout since the run",
    }
    for source in by:
        worktree = source.removeprefix("restore:")  # (restore/inputs.py RESTORED + the worktree's name)
        if worktree != source:
            words[source] = (f"written again by an earlier restore (its worktree {worktree}), taken from "
                             "there (sha256-verified)")  # fmt: skip
    return [
        f"{len(paths)} file(s) {words.get(source, source)}: " + ", ".join(paths[:5])
        + (" ..." if len(paths) > 5 else "")
        for source, paths in by.items()
    ]  # fmt: skip


def restore_result(result: RestoreResult) -> None:
    """`cascade restore`: the worktree, the re-run and its verdict (or how to run it, with --no-run)."""
    tree = result.worktree
    if result.run is None:
        notice(f"restored into {tree.path}" + (" (reused)" if tree.reused else ""))
        notice(f"run it: {result.rerun_command}")
        return
    run_result(result.run)
    if result.verdict is not None:
        verdict(result.verdict)


def restore_dict(result: RestoreResult) -> dict[str, Any]:
    """`cascade restore --json`: plan, worktree, re-run and verdict as one JSON object."""
    run = result.run
    return {
        "plan": result.plan.to_dict(),
        "worktree": {
            "path": str(result.worktree.path),
            "reused": result.worktree.reused,
            "restored_files": list(result.worktree.restored_files),
        },  # fmt: skip
        "run": None
        if run is None
        else {"run_id": run.run_id, "status": run.status, "exit_code": run.exit_code},
        "rerun_command": result.rerun_command if run is None else None,
        "verdict": None if result.verdict is None else result.verdict.to_dict(),
        "interrupted": result.interrupted,  # the signal that stopped the re-run (no verdict then)
        "image": None
        if result.image is None
        else {
            **result.image.record(),
            "source": "recorded" if result.image.reused_by_id else "rebuilt",
            "drift": [c.to_dict() for c in result.drift],
        },
    }


def checkout_result(result: CheckoutResult) -> None:
    """`cascade checkout`: the checkpoint chosen and why, and each file fetched, md5-verified."""
    if result.chosen is not None:
        entry = result.chosen.entry
        why = result.chosen.why
        said = f"step {entry.step}"  # (`--checkpoint 3`: the reason is that step, said once)
        step = f"{said}; " if entry.step is not None and not why.startswith(said) else ""
        notice(f"took {entry.path} ({step}{why})")
    for item in result.items:
        notice(f"{item.path} → {item.written_to} (md5 {item.md5[:12]} verified, from the {item.source})")
    for path in result.not_kept:
        notice(f"not checked out: {path}: the record has no copy of the bytes the run read")


def push_result(result: PushSummary, as_json: bool) -> None:
    """`cascade push`: how many objects reached the remote, or that the run has nothing to push."""
    if as_json:
        data = asdict(result)
        emit_json("push", {**data, "failed": list(data["failed"]), "nothing_to_push": result.nothing})
    elif result.nothing:
        notice(f"nothing to push: run {result.run_id[:12]} kept no checkpoints and read no DVC-tracked data")
    else:
        notice(f"pushed {result.pushed} object(s) of run {result.run_id[:12]} to {result.remote}")
