"""Reading recorded runs: show, verify, and the helpers every reading use case shares."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from cascade_repro.distributed import recorded_layout, trace_artifact
from cascade_repro.errors import DataError
from cascade_repro.manifest import Manifest
from cascade_repro.project import find_repo_root
from cascade_repro.settings import Settings, load_settings
from cascade_repro.store.dvc_store import Cache
from cascade_repro.store.run_store import RunStore

if TYPE_CHECKING:
    from cascade_repro.determinism.verdict import Verdict
    from cascade_repro.run_plan import Notify


def context(cwd: Path | None) -> Settings:
    """The project's settings; runs whose `cascade run` died are recovered first (see recovery.py)."""
    from cascade_repro.api.spooled import finish_dead_runs

    root = find_repo_root(cwd)
    settings = load_settings(root)
    finish_dead_runs(settings)
    return settings


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


def show_run(ref: str, cwd: Path | None = None, trace: bool = False) -> RunRecord:
    settings = context(cwd)
    store = RunStore.open(settings)
    run = store.resolve(ref)
    data = store.record(run.run_id)
    manifest = Manifest.from_dict(data)
    header = data.get("trace") or {}
    summary = _summarize_trace(_trace(store, run.run_id, header.get("artifact")), header) if trace else None
    return RunRecord(manifest, str(run.status), dict(run.metrics), dict(run.tags), str(run.artifact_uri),
                     summary)  # fmt: skip


def _summarize_trace(records: list[dict[str, Any]], header: Mapping[str, Any]) -> TraceSummary:
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
    )


def verify(
    ref_a: str,
    ref_b: str,
    cwd: Path | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    record: bool = True,
    replay: bool = False,
    notify: Notify = lambda message: None,
) -> Verdict:
    """Compare two recorded runs step by step; record the verdict on the later one.

    `replay`: where they diverge in tensors, re-run both to that step and measure the difference."""
    settings = context(cwd)
    store = RunStore.open(settings)
    runs = [store.resolve(ref) for ref in (ref_a, ref_b)]
    earlier, later = sorted(runs, key=lambda r: r.start_ms or 0)
    manifests = [store.record(r.run_id) for r in runs]
    verdict = judge_runs(store, manifests[0], manifests[1], rtol, atol)
    if replay and not verdict.reproduced:
        from cascade_repro.api.replay import replay_divergence
        from cascade_repro.determinism.verdict import with_replay

        verdict = with_replay(verdict, *replay_divergence(verdict, cwd, notify))
    if record:
        record_verdict(store, verdict, later.run_id, earlier.run_id)
    return verdict


def judge_runs(
    store: RunStore,
    manifest_a: dict[str, Any],
    manifest_b: dict[str, Any],
    rtol: float,
    atol: float,
    steps: int | None = None,
) -> Verdict:
    """The verdict on two recorded runs, from their records and traces."""
    from cascade_repro.determinism.verdict import judge_ranks  # not on `cascade run`'s start path

    traces = [_rank_traces(store, str(m["run_id"]), m) for m in (manifest_a, manifest_b)]
    return judge_ranks(manifest_a, manifest_b, traces[0], traces[1], rtol=rtol, atol=atol, steps=steps)


def _rank_traces(store: RunStore, run_id: str, manifest: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    """Each rank's step trace, rank 0 first (one for a single process); [] for a rank without one."""
    traces = [_trace(store, run_id, (manifest.get("trace") or {}).get("artifact"))]
    layout = recorded_layout(manifest)
    traced = {e["rank"] for e in layout.get("ranks") or [] if isinstance(e, dict) and e.get("trace")}
    local = layout.get("nproc_per_node", 1)  # the ranks recorded on rank 0's machine (checked ≤ 256)
    for rank in range(1, local if isinstance(local, int) and layout.get("ranks") is not None else 1):
        if rank in traced:  # the artifact's name is made here from the (checked) rank, never read
            traces.append(_trace(store, run_id, trace_artifact(rank)))
        else:
            traces.append([])
    return traces


def record_verdict(store: RunStore, verdict: Verdict, record_on: str, against: str) -> None:
    """The verdict as a tag and a report artifact on the later run."""
    store.set_tags(record_on, {"cascade.verdict": verdict.verdict, "cascade.verified_against": against})
    store.log_json(record_on, verdict.to_dict(), f"cascade/verify/{against}.json")


def _trace(store: RunStore, run_id: str, artifact: str | None) -> list[dict[str, Any]]:
    """A step trace's records (none without an artifact); a run killed mid-write keeps its whole ones."""
    if not artifact:
        return []
    text = store.text(run_id, artifact)
    records = []
    for line in text.splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                break  # a run killed mid-write: its trace ends at the last whole record
    return records


def record_of(settings: Settings, ref: str) -> tuple[str, dict[str, Any]]:
    store = RunStore.open(settings)
    run_id = store.resolve(ref).run_id
    return run_id, store.record(run_id)


def dvc_cache(root: Path) -> Cache:
    if not Cache.exists_for(root):
        raise DataError(f"{root} is not a DVC repository", hint="run `cascade init` (it runs `dvc init`)")
    return Cache(root)
