"""`cascade verify --replay`: re-run both runs up to their first divergence and measure it there.

Fingerprints say which tensors differ at step k, not by how much. Each run is restored (code, dirty
state, data, recorded environment) and re-run for k+1 steps with its tensors of step k saved; each
replay must reproduce its own recorded trace bit for bit up to there, or the saved tensors would not
be that run's, and nothing is measured. Both replays are recorded as runs, like any restore.

Where the traces only bracket the divergence (a trace budget fingerprinted the weights at some
steps only: they agreed at step j and something differs at step k > j + 1), the replays run with
every facet at every step and save the tensors of every step from j+1 to k (child/trace_dump.py);
their two traces pin the exact step and tensors, measured there from what was saved. A second pair
of replays only when the pinned step's tensors are not among them (a step before the bracket, or a
bracket too large to save whole).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from cascade_repro.api.judging import trace_records
from cascade_repro.api.loading import load_project
from cascade_repro.api.restoring import restore
from cascade_repro.child.trace_dump import free_space, not_saved, step_file
from cascade_repro.determinism.compare import TraceComparison, compare_traces
from cascade_repro.determinism.magnitude import TENSOR_FACETS, Magnitude, magnitudes
from cascade_repro.determinism.verdict import BITWISE_IDENTICAL, Verdict
from cascade_repro.run_plan import Notify
from cascade_repro.store.run_store import RunStore


def replay_divergence(
    verdict: Verdict, cwd: Path | None, notify: Notify
) -> tuple[list[Magnitude], dict[str, Any], TraceComparison | None]:
    """The magnitudes at the first divergence, the replay's record (runs, what was not measured, the
    step pinned), and the comparison with the exact step where the traces had only bracketed it."""
    comparison = verdict.comparison
    if comparison.step is None:
        return [], {"runs": {}, "not_measured": ["nothing to replay: no step differs"]}, None
    runs: dict[str, str] = {}
    # a bracket (its first step the one after the last whose weights agreed): every step of it saved,
    # where the traces of these replays may pin the divergence
    first = comparison.step if comparison.bracket_start is None else comparison.bracket_start
    replayed, failure = _replay_both(verdict, first, comparison.step, cwd, notify, runs)
    pinned: TraceComparison | None = None
    if failure is None and first != comparison.step:
        pinned, failure = _pin(comparison, replayed, cwd)
    if failure is not None:
        return [], {"runs": runs, "not_measured": [failure]}, None
    if pinned is not None:
        comparison = pinned
    step = comparison.step
    assert step is not None
    record: dict[str, Any] = {"runs": runs, "not_measured": []}
    if pinned is not None:
        bracket = [verdict.comparison.bracket_start, verdict.comparison.step]
        record["pinned"] = {"step": step, "bracket": bracket}
    tensor_facets = [d for d in comparison.differences if d.facet in TENSOR_FACETS]
    if not tensor_facets:
        record["not_measured"] = [f"nothing to measure: at step {step} no tensor differs"]
        return [], record, pinned
    replays = load_project(cwd).paths.replays
    directories = [_directory(replays, run_id) for run_id in (verdict.run_a, verdict.run_b)]
    dumps = [step_file(directory, step) for directory in directories]
    failure = _not_saved(directories, dumps, step, verdict)
    if failure is None and not all(path.is_file() for path in dumps):
        # pinned before the bracket, or past what was saved (kept apart in the record as a_measured)
        _, failure = _replay_both(verdict, step, step, cwd, notify, runs, "_measured")
        failure = failure or _not_saved(directories, dumps, step, verdict, missing_is_failure=True)
    if failure is not None:
        record["not_measured"] = [failure]
        return [], record, pinned
    import torch

    saved = [torch.load(path, map_location="cpu", weights_only=True) for path in dumps]
    found, missing = magnitudes(torch, saved[0], saved[1], tensor_facets)
    record["not_measured"] = missing
    for run_id in (verdict.run_a, verdict.run_b):  # the bracket's other steps: not needed any more
        _keep_only(_directory(replays, run_id), step)
    return found, record, pinned


def _replay_both(verdict: Verdict, first: int, last: int, cwd: Path | None, notify: Notify,
                 runs: dict[str, str], label: str = "") -> tuple[dict[str, str], str | None]:  # fmt: skip
    """Both runs re-run for last+1 steps, every facet traced, the tensors of steps first..last saved:
    the replays' run ids by side, or why they cannot be measured (a replay that did not reproduce
    its run)."""
    replays = load_project(cwd).paths.replays
    replayed: dict[str, str] = {}
    saving = f"step {last}" if first == last else f"steps {first}-{last}"
    for side, run_id in (("a", verdict.run_a), ("b", verdict.run_b)):
        directory = _directory(replays, run_id)
        shutil.rmtree(directory, ignore_errors=True)
        notify(f"replay {side}: re-running {run_id[:12]} for {last + 1} steps to save {saving}")
        result = restore(run_id, cwd=cwd, steps=last + 1, dump=(first, last, directory), notify=notify)
        if result.interrupted is not None:  # the user stopped the replay (said by restore)
            raise KeyboardInterrupt
        assert result.run is not None and result.verdict is not None  # execute=True
        runs[side + label] = replayed[side] = result.run.run_id
        if result.verdict.verdict != BITWISE_IDENTICAL:
            return replayed, (
                f"the replay of {run_id[:12]} did not reproduce its own trace up to step {last} "
                f"({result.verdict.verdict}: {result.verdict.summary}), so its tensors there are not "
                "that run's: the two runs differ by where they ran, which the fingerprints and causes show"
            )
    return replayed, None


def _pin(bracketed: TraceComparison, replayed: dict[str, str],
         cwd: Path | None) -> tuple[TraceComparison | None, str | None]:  # fmt: skip
    """The exact first divergence, from the two replays' traces (every facet at every step)."""
    store = RunStore.open(load_project(cwd), fast_reads=True)
    traces = []
    for side in ("a", "b"):
        run_id = replayed[side]
        traces.append(trace_records(store, run_id, store.record(run_id).trace_header.get("artifact")))
    found = compare_traces(traces[0], traces[1])
    if found.step is None or found.bracket_start is not None:
        return None, (
            f"the replays, traced at every step, agree up to step {bracketed.step} where the recorded "
            "traces differ: the divergence did not happen again, so it is not pinned"
        )
    # the loss too: where the replays' every-step traces first differ in it, if within them
    loss = found.loss_first_difference or bracketed.loss_first_difference
    return replace(bracketed, step=found.step, differences=found.differences, bracket_start=None,
                   loss_first_difference=loss), None  # fmt: skip


def _not_saved(directories: list[Path], dumps: list[Path], step: int, verdict: Verdict,
               missing_is_failure: bool = False) -> str | None:  # fmt: skip
    """Why the tensors of `step` are not there, where a replay said it could not save them (or, with
    `missing_is_failure`, where a replay that was asked for that step left no file)."""
    for directory, dump in zip(directories, dumps, strict=True):
        if dump.is_file():
            continue
        reason = not_saved(directory)
        if reason is None and not missing_is_failure:
            continue
        reason = reason or f"no file was written to {dump} ({free_space(dump)})"
        return (
            f"{reason}. Free space on that disk (or remove {directory.parent}) and run "
            f"`cascade verify {verdict.run_a[:12]} {verdict.run_b[:12]} --replay` again"
        )
    return None


def _directory(replays: Path, run_id: str) -> Path:
    return replays / run_id[:12]


def _keep_only(directory: Path, step: int) -> None:
    kept = step_file(directory, step).parent
    for saved in directory.glob("step*"):
        if saved != kept:
            shutil.rmtree(saved, ignore_errors=True)
