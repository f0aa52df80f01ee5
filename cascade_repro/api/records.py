"""Reading recorded runs: show, verify, and the helpers every reading use case shares."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from cascade_repro.api.judging import judge_runs, record_verdict, trace_records
from cascade_repro.api.loading import load_project
from cascade_repro.child.trace_budget import parse_budget, parse_cost, parse_schedule
from cascade_repro.determinism.tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from cascade_repro.determinism.trace_file import step_of
from cascade_repro.errors import CascadeError
from cascade_repro.manifest import Manifest
from cascade_repro.store.run_store import RunStore, StoredRun

if TYPE_CHECKING:
    from cascade_repro.determinism.verdict import Verdict
    from cascade_repro.run_plan import Notify


@dataclass(frozen=True)
class RunRecord:
    """`cascade show`: the manifest plus what MLflow knows beyond it."""

    manifest: Manifest
    status: str
    metrics: dict[str, float]
    tags: dict[str, str]
    artifact_uri: str
    trace: TraceSummary | None = None


@dataclass(frozen=True)
class TraceSummary:
    """`cascade show --trace`: what the step trace holds, and the loss curve's extremes."""

    steps: int
    first_step: int | None
    last_step: int | None
    algorithm: str | None
    interval: int | None
    grads: bool | None  # gradients hashed (trace_grads, or where cheap)
    loss_first: float | None
    loss_last: float | None
    loss_min: tuple[int, float] | None  # (step, value)
    loss_max: tuple[int, float] | None
    nonfinite_losses: int
    batches: int = 0  # steps with a batch fingerprint (none: the script reads no torch DataLoader)
    budget: float | None = None  # trace_budget: the share of step time the trace keeps to (0: every facet)
    # what the trace took of the training loop's time, as the child measured it: share, every_step,
    # sampled (shares) and step_ms; None for a run recorded before it was measured
    cost: dict[str, float] | None = None
    # the steps with a record, [(from step, every)], where a budget thinned them (None: every step)
    records: tuple[tuple[int, int], ...] | None = None
    # the steps that never returned: their optimizer raised (the script went on), or the run ended inside
    # the last (a killed closure)
    unfinished: tuple[int, ...] = ()


def show_run(ref: str, cwd: Path | None = None, trace: bool = False) -> RunRecord:
    """`cascade show`: the record of a run (a version label, a run id or a prefix of one), its
    status, metrics and tags; `trace`: a summary of its step trace as well."""
    settings = load_project(cwd)
    store = RunStore.open(settings, fast_reads=True)
    run = store.resolve(ref)
    manifest = store.record(run.run_id)
    header = manifest.trace_header
    summary = (
        _summarize_trace(trace_records(store, run.run_id, header.get("artifact")), header) if trace else None
    )
    return RunRecord(manifest, str(run.status), dict(run.metrics), dict(run.tags), str(run.artifact_uri),
                     summary)  # fmt: skip


def _summarize_trace(records: Sequence[dict[str, Any]], header: Mapping[str, Any]) -> TraceSummary:
    losses = [(int(r["step"]), float(r["loss"]["value"])) for r in records if r.get("loss")]
    finite = [(step, value) for step, value in losses if math.isfinite(value)]
    return TraceSummary(
        steps=len(records),
        first_step=records[0]["step"] if records else None,
        last_step=records[-1]["step"] if records else None,
        algorithm=header.get("algorithm"),
        interval=header.get("interval"),
        grads=header.get("grads"),
        loss_first=losses[0][1] if losses else None,
        loss_last=losses[-1][1] if losses else None,
        loss_min=min(finite, key=lambda item: item[1]) if finite else None,
        loss_max=max(finite, key=lambda item: item[1]) if finite else None,
        nonfinite_losses=len(losses) - len(finite),
        batches=sum(1 for r in records if r.get("batch")),
        budget=_budget(header.get("budget")) if header.get("algorithm") else None,
        cost=parse_cost(header.get("cost")),
        records=_thinned(header.get("records")),
        unfinished=tuple(step_of(r, i) for i, r in enumerate(records) if r.get("unfinished") is True),
    )


def _thinned(value: Any) -> tuple[tuple[int, int], ...] | None:
    """The recorded steps' schedule (untrusted), where some steps have no record."""
    schedule = parse_schedule(value)
    return tuple(schedule) if schedule and any(every > 1 for _, every in schedule) else None


def _budget(value: Any) -> float | None:
    """The recorded trace budget (untrusted: a share or nothing); absent: 0, every step sampled."""
    return 0.0 if value is None else parse_budget(value)


def _refuse_running(run: StoredRun) -> None:
    """A run in progress has stored no trace yet (it is stored when the run ends): nothing to judge."""
    if run.status != "RUNNING":
        return
    import time

    from cascade_repro.api.browsing import STALE_AFTER_S

    beat = run.heartbeat_s
    if beat is not None and time.time() - beat > STALE_AFTER_S:
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(beat))
        raise CascadeError(f"run {run.run_id[:12]} is still RUNNING in the store, but its cascade process "
                           f"has not been heard from since {since}",
                           hint="on the machine that ran it, `cascade sync` finishes it")  # fmt: skip
    at = time.strftime("%H:%M:%S", time.localtime(run.start_ms / 1000)) if run.start_ms else None
    started = f", started {at}" if at else ""
    raise CascadeError(f"run {run.run_id[:12]} is still RUNNING{started}: its trace is stored when it ends",
                       hint="verify it once it has ended (`cascade ls --running` lists runs in progress)")


def verify(
    ref_a: str,
    ref_b: str,
    cwd: Path | None = None,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    record: bool = True,
    replay: bool = False,
    notify: Notify = lambda message: None,
    shown: Callable[[Verdict], None] = lambda verdict: None,
) -> Verdict:
    """Compare two recorded runs step by step; record the verdict on the later one.

    `replay`: where they diverge in tensors, re-run both to that step and measure the difference.
    `shown` gets the verdict as soon as it is known, before it is recorded (recording it imports
    MLflow, seconds on the embedded store, where the verdict itself takes a fraction of one)."""
    settings = load_project(cwd)
    store = RunStore.open(settings, fast_reads=True)
    runs = [store.resolve(ref) for ref in (ref_a, ref_b)]
    manifests = [store.record(r.run_id) for r in runs]  # (a run not made by cascade is named first)
    for run in runs:
        _refuse_running(run)
    earlier, later = sorted(runs, key=lambda r: r.start_ms or 0)
    verdict = judge_runs(store, manifests[0], manifests[1], rtol, atol)
    if replay and not verdict.reproduced:
        from cascade_repro.api.replay import replay_divergence
        from cascade_repro.determinism.verdict import with_replay

        replayed = replay_divergence(verdict, cwd, notify)
        verdict = with_replay(verdict, *replayed, records=(manifests[0], manifests[1]))
    shown(verdict)
    if record:
        record_verdict(store, verdict, later.run_id, earlier.run_id)
    return verdict
