"""The verdict on two recorded runs, from their records and step traces in the store (every rank's),
and the verdict recorded on the later run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cascade_repro.determinism.trace_file import TraceRecords
from cascade_repro.distributed import trace_artifact
from cascade_repro.store.run_store import RunStore

if TYPE_CHECKING:
    from cascade_repro.determinism.verdict import Verdict
    from cascade_repro.manifest import Manifest


def judge_runs(
    store: RunStore,
    manifest_a: Manifest,
    manifest_b: Manifest,
    rtol: float,
    atol: float,
    steps: int | None = None,
    trace_a: TraceRecords | None = None,
) -> Verdict:
    """The verdict on two recorded runs, from their records and traces (`trace_a`: run a's, rank 0's,
    where read already)."""
    from cascade_repro.determinism.verdict import judge_ranks  # not on `cascade run`'s start path

    traces = [_rank_traces(store, manifest_a.run_id, manifest_a, trace_a),
              _rank_traces(store, manifest_b.run_id, manifest_b)]  # fmt: skip
    return judge_ranks(manifest_a, manifest_b, traces[0], traces[1], rtol=rtol, atol=atol, steps=steps)


def _rank_traces(store: RunStore, run_id: str, manifest: Manifest,
                 first: TraceRecords | None = None) -> list[TraceRecords]:  # fmt: skip
    """Each rank's step trace, rank 0 first (one for a single process; `first`, where read already);
    [] for a rank without one."""
    if first is None:
        first = trace_records(store, run_id, manifest.trace_header.get("artifact"))
    traces = [first]
    layout = manifest.layout
    entries = [e for e in layout.get("ranks") or [] if isinstance(e, dict)]
    traced = {e["rank"] for e in entries if e.get("trace")}
    # every rank listed (checked: 1 ≤ rank < world size, fewer entries than that), and rank 0's node's
    local = layout.get("nproc_per_node", 1) if layout.get("ranks") is not None else 1
    last = max([local - 1 if isinstance(local, int) else 0, *(e["rank"] for e in entries)])
    for rank in range(1, last + 1):
        if rank in traced:  # the artifact's name is made here from the (checked) rank, never read
            traces.append(trace_records(store, run_id, trace_artifact(rank)))
        else:
            traces.append(TraceRecords([]))
    return traces


def record_verdict(store: RunStore, verdict: Verdict, record_on: str, against: str) -> None:
    """The verdict as a tag and a report artifact on the later run."""
    store.set_tags(record_on, {"cascade.verdict": verdict.verdict, "cascade.verified_against": against})
    store.log_json(record_on, verdict.to_dict(), f"cascade/verify/{against}.json")


def trace_records(store: RunStore, run_id: str, artifact: str | None) -> TraceRecords:
    """A step trace's records, parsed where read (none without an artifact); a run killed mid-write
    keeps its whole ones."""
    if not artifact:
        return TraceRecords([])
    where = f"the trace {artifact} of run {run_id[:12]}"
    with store.open_binary(run_id, artifact) as stream:  # a line at a time, each bounded
        return TraceRecords.from_stream(stream, where)
