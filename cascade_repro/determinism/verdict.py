"""The verdict of comparing two runs: BITWISE_IDENTICAL, NUMERICALLY_EQUIVALENT, DIVERGED, INCOMPARABLE."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from cascade_repro.determinism import trace_formats
from cascade_repro.determinism.compare import (
    FACET_WORDS,
    FACETS,
    TraceComparison,
    compare_traces,
    losses_within,
)
from cascade_repro.determinism.explain import Cause, Difference, likely_causes, manifest_differences
from cascade_repro.determinism.magnitude import Magnitude
from cascade_repro.determinism.tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from cascade_repro.determinism.trace_file import has_batches, on_common_steps, steps_ended
from cascade_repro.errors import EXIT_NOT_REPRODUCED, EXIT_OK
from cascade_repro.manifest import Manifest
from cascade_repro.record_sections import error_line, single_line

BITWISE_IDENTICAL = "BITWISE_IDENTICAL"
NUMERICALLY_EQUIVALENT = "NUMERICALLY_EQUIVALENT"
DIVERGED = "DIVERGED"
INCOMPARABLE = "INCOMPARABLE"
REPRODUCED = (BITWISE_IDENTICAL, NUMERICALLY_EQUIVALENT)


# a script that reads its data without a torch DataLoader (nanoGPT's get_batch over a memmap)
NO_BATCHES = ("batches are not compared: neither run read its data through a torch DataLoader, whose "
              "batches the trace fingerprints (data read another way is covered by the input files each "
              "run recorded and by the RNG state that samples them)")


@dataclass(frozen=True)
class Verdict:
    """Whether run B reproduced run A: the verdict, the first divergence, the records' differences
    and the likely causes."""

    verdict: str
    run_a: str
    run_b: str
    comparison: TraceComparison
    differences: tuple[Difference, ...]
    causes: tuple[Cause, ...]
    summary: str
    # `cascade verify --replay`: how far the differing tensors are apart at the first divergence
    magnitudes: tuple[Magnitude, ...] = ()
    replay: Mapping[str, Any] | None = None  # the replay runs, and what could not be measured
    # a torchrun job: each rank's verdict, rank 0 first (the verdict above is the first that failed)
    ranks: tuple[RankVerdict, ...] = ()

    @property
    def reproduced(self) -> bool:
        return self.verdict in REPRODUCED

    @property
    def exit_status(self) -> int:
        """`cascade verify`'s exit code: 0 reproduced (bitwise or within tolerance), 3 not."""
        return EXIT_OK if self.reproduced else EXIT_NOT_REPRODUCED

    def to_dict(self) -> dict[str, Any]:
        c = self.comparison
        return {
            "schema": "cascade.verdict/1",
            "verdict": self.verdict,
            "run_a": self.run_a,
            "run_b": self.run_b,
            "summary": self.summary,
            "steps": {"a": c.steps_a, "b": c.steps_b, "compared": c.compared},
            "first_divergence": None
            if c.step is None
            else {
                "step": c.step,
                "bracket": None if c.bracket_start is None else [c.bracket_start, c.step],
                "facets": [d.to_dict() for d in c.differences],
                "magnitudes": [m.to_dict() for m in self.magnitudes],
            },
            "replay": None if self.replay is None else dict(self.replay),
            "loss_max_relative_difference": c.loss_max_rel,
            "loss_first_difference": None
            if c.loss_first_difference is None
            else c.loss_first_difference.to_dict(),
            "record_differences": [d.to_dict() for d in self.differences],
            "notes": list(c.notes),
            "likely_causes": [cause.to_dict() for cause in self.causes],
            "ranks": [rank.to_dict() for rank in self.ranks],
        }


@dataclass(frozen=True)
class RankVerdict:
    """One rank's verdict in a torchrun job (the job's verdict is the first that failed)."""

    rank: int
    verdict: str
    summary: str
    steps: int  # compared

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "verdict": self.verdict, "summary": self.summary, "steps": self.steps}


# why a run that ran to its end has no step in its trace (`verify`'s INCOMPARABLE, `show`'s trace line)
NO_STEP_TRACED = ("the script's own process never called backward() or an optimizer's step (training in "
                  "processes it started, such as torch.multiprocessing.spawn's or a subprocess's, is not "
                  "traced; torchrun's ranks are: `cascade run --nproc-per-node N`)")  # fmt: skip

def judge_ranks(
    manifest_a: Manifest,
    manifest_b: Manifest,
    traces_a: Sequence[Sequence[dict[str, Any]]],
    traces_b: Sequence[Sequence[dict[str, Any]]],
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    steps: int | None = None,
) -> Verdict:
    """Two torchrun jobs, rank by rank (`traces_*[k]`: rank k's trace). Rank 0 first; the verdict is the
    first rank's that did not reproduce, else rank 0's (NUMERICALLY_EQUIVALENT if any rank was)."""
    first = judge(manifest_a, manifest_b, traces_a[0], traces_b[0], rtol, atol, steps)
    if len(traces_a) <= 1 and len(traces_b) <= 1:
        return first
    verdicts = [first]
    if len(traces_a) == len(traces_b):
        for rank in range(1, len(traces_a)):
            verdicts.append(judge(manifest_a, manifest_b, traces_a[rank], traces_b[rank], rtol, atol, steps))
    ranks = tuple(RankVerdict(k, v.verdict, v.summary, v.comparison.compared) for k, v in enumerate(verdicts))
    failed = _earliest_failure(verdicts)
    if len(traces_a) != len(traces_b):
        sizes = f"{len(traces_a)} vs {len(traces_b)} ranks"
        if failed is None:  # rank 0 alone agreed: the others cannot be paired
            summary = f"rank 0: {first.summary}; the other ranks are not compared ({sizes})"
            return replace(first, verdict=INCOMPARABLE, ranks=ranks, summary=summary)
        return replace(first, ranks=ranks, summary=f"rank 0: {first.summary} ({sizes})")
    if failed is not None:
        chosen = verdicts[failed]
        return replace(chosen, ranks=ranks, summary=f"rank {failed}: {chosen.summary}")
    equivalent = next((v for v in verdicts if v.verdict == NUMERICALLY_EQUIVALENT), None)
    chosen = equivalent or first
    count = sum(v.comparison.compared for v in verdicts)
    everywhere = f"every rank's steps are bitwise identical ({len(verdicts)} ranks, {count} steps in all)"
    summary = chosen.summary if equivalent else everywhere
    return replace(chosen, ranks=ranks, summary=summary)


def _incomparable(manifest_a: Manifest, manifest_b: Manifest, traced_a: bool,
                  traced_b: bool) -> str | None:  # fmt: skip
    """Why two runs' traces cannot be compared at all: one has none, or they were made differently."""
    if not traced_a or not traced_b:
        record = manifest_a if not traced_a else manifest_b
        missing = record.run_id
        ended = crashed(record)
        if ended:  # a script that died before its first step: that is the reason, not a trace setting
            return f"run {missing[:12]} {ended} before its first traced step"
        if not record.trace_header:
            return f"run {missing[:12]} has no step trace (recorded with --trace-interval 0)"
        return f"run {missing[:12]} recorded no training step: {NO_STEP_TRACED}"
    header_a, header_b = manifest_a.trace_header, manifest_b.trace_header
    for key in ("algorithm", "interval"):
        if header_a.get(key) != header_b.get(key):
            values = " vs ".join(single_line(header.get(key)) for header in (header_a, header_b))
            return f"the traces differ in {key}: {values}"
    return trace_formats.scaler_incomparable(header_a, header_b, manifest_a.run_id, manifest_b.run_id)


def judge(
    manifest_a: Manifest,
    manifest_b: Manifest,
    trace_a: Sequence[dict[str, Any]],
    trace_b: Sequence[dict[str, Any]],
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    steps: int | None = None,
) -> Verdict:
    """`steps`: compare only steps 0..steps-1 (a re-run of a prefix, `cascade restore --steps`). A run
    with a record past them ran them all, whether or not a budget left it a record at the last."""
    ran: tuple[int, int] | None = None
    if steps is not None:
        ran = (min(steps_ended(trace_a), steps), min(steps_ended(trace_b), steps))
        trace_a = [r for r in trace_a if int(r.get("step", 0)) < steps]
        trace_b = [r for r in trace_b if int(r.get("step", 0)) < steps]
    a_id, b_id = manifest_a.run_id, manifest_b.run_id
    differences = tuple(manifest_differences(manifest_a, manifest_b))

    def verdict(
        kind: str, summary: str, comparison: TraceComparison, causes: tuple[Cause, ...] = ()
    ) -> Verdict:
        return Verdict(kind, a_id, b_id, comparison, differences, causes, summary)

    reason = _incomparable(manifest_a, manifest_b, bool(trace_a), bool(trace_b))
    if reason:
        return verdict(INCOMPARABLE, reason, compare_traces([], []))
    trace_a, trace_b, notes = _compared_facets(manifest_a, manifest_b, trace_a, trace_b)
    compared, trace_a, trace_b = _compare(trace_a, trace_b, manifest_a.trace_header, ran)
    comparison = replace(compared, notes=(*compared.notes, *notes))
    causes = tuple(likely_causes(manifest_a, manifest_b, comparison, list(differences)))
    if comparison.step is None and comparison.same_length and (unseen := _saved_tensors_differ(
            manifest_a, manifest_b)):  # fmt: skip
        summary = (f"all {comparison.compared} traced steps are bitwise identical, but the tensors saved in "
                   f"{unseen} differ: state the trace does not fingerprint differs")  # fmt: skip
        ours = sum(1 for d in differences if d.klass == "B")  # (what the records say differs comes first)
        return verdict(DIVERGED, summary, comparison, (*causes[:ours], _unseen_state(unseen), *causes[ours:]))
    if comparison.step is None and comparison.same_length:
        scope = (
            (f"the {comparison.compared} steps both traces recorded in the first {steps} (those re-run)"
             if _thinned(comparison) else f"the first {comparison.compared} steps (those re-run)")
            if steps is not None
            else (f"the {comparison.compared} steps both traces recorded (of {comparison.steps_a})"
                  if _thinned(comparison) else f"all {comparison.compared} steps")
        )
        return verdict(BITWISE_IDENTICAL, f"{scope} are bitwise identical{_ends(manifest_a, manifest_b)}",
                       comparison)  # fmt: skip
    where = _where(comparison) if comparison.step is not None else ""
    if not comparison.same_length:
        first, count = min(comparison.steps_a, comparison.steps_b), comparison.compared
        shared = f"the {count} steps both recorded in the first {first}" if _thinned(comparison) else \
            f"the first {count}"  # fmt: skip
        overlap = f"{shared} are bitwise identical" if comparison.step is None else f"within them, {where}"
        ended = [f"run {m.run_id[:12]} {how}" for m in (manifest_a, manifest_b) if (how := crashed(m))]
        why = f" ({'; '.join(ended)})" if ended else ""  # (a run stopped short says why it is short)
        summary = f"the runs have {comparison.steps_a} and {comparison.steps_b} steps{why}; {overlap}"
        return verdict(INCOMPARABLE, summary, comparison, causes)
    class_a = [d for d in differences if d.klass == "A"]
    if class_a and losses_within(trace_a, trace_b, rtol, atol):
        summary = (
            f"losses agree within rtol {rtol:g} (max {comparison.loss_max_rel:.2g}); bitwise equality is not "
            f"expected because {class_a[0].summary}"
        )
        return verdict(NUMERICALLY_EQUIVALENT, summary, comparison, causes)
    return verdict(DIVERGED, where, comparison, causes)


def _compared_facets(manifest_a: Manifest, manifest_b: Manifest, trace_a: Sequence[dict[str, Any]],
                     trace_b: Sequence[dict[str, Any]]) -> tuple[Any, Any, tuple[str, ...]]:  # fmt: skip
    """The traces without the facets one run did not record at all (its gradients, its batches), and
    notes saying so."""
    a_id, b_id = manifest_a.run_id, manifest_b.run_id
    header_a, header_b = manifest_a.trace_header, manifest_b.trace_header
    notes: tuple[str, ...] = ()
    if header_a.get("grads", True) != header_b.get("grads", True):  # e.g. a CPU run against a GPU run
        trace_a, trace_b = _without_grads(trace_a), _without_grads(trace_b)
        notes = (
            f"gradients are not compared: run {a_id[:12] if not header_a.get('grads', True) else b_id[:12]} "
            "did not hash them (trace_grads)",
        )
    batched = [has_batches(trace_a), has_batches(trace_b)]
    if batched[0] != batched[1]:  # compare.py skips a batch one run did not read
        notes = (*notes, f"batches are not compared: run {(b_id if batched[0] else a_id)[:12]} recorded none "
                         "(recorded before cascade read mappings such as HF's BatchEncoding?)")  # fmt: skip
    elif not batched[0] and trace_a and trace_b:
        notes = (*notes, NO_BATCHES)
    older = [trace_formats.recorded_one_micro_batch(h) for h in (header_a, header_b)]
    if older[0] != older[1]:  # one run recorded before a step held all its micro-batches
        if older[0]:
            trace_a, trace_b, adapted = trace_formats.as_one_micro_batch(trace_a, trace_b)
        else:
            trace_b, trace_a, adapted = trace_formats.as_one_micro_batch(trace_b, trace_a)
        if adapted:
            notes = (*notes, f"run {(a_id if older[0] else b_id)[:12]} was recorded by a cascade that kept "
                             "one micro-batch a step: steps that trained on several (gradient accumulation) "
                             "are compared on their last loss, and not on their batches")  # fmt: skip
    return trace_a, trace_b, notes


def _compare(trace_a: Sequence[dict[str, Any]], trace_b: Sequence[dict[str, Any]], header: Mapping[str, Any],
             ran: tuple[int, int] | None = None) -> tuple[TraceComparison, Any, Any]:  # fmt: skip
    """The comparison of two traces, at the steps both recorded where a budget thinned the records of
    either (one a step otherwise; --trace-interval N: every Nth in both, as their headers agree), and
    the two traces as compared (cut to those steps). `ran`: how many steps each ran, where the records
    do not say it (a prefix of a run: `judge`'s `steps`)."""
    if header.get("interval", 1) != 1:
        return compare_traces(trace_a, trace_b), trace_a, trace_b
    trace_a, trace_b, recorded = on_common_steps(trace_a, trace_b)
    return compare_traces(trace_a, trace_b, ran or recorded, gaps_bracket=True), trace_a, trace_b


def _saved_tensors_differ(a: Manifest, b: Manifest) -> str | None:
    """`PATH at step N` of the first checkpoint both runs saved (the same path, step and occurrence)
    whose tensors' fingerprints differ (child/saved_tensors.py); None where every such pair agrees."""
    def saved(m: Manifest) -> dict[tuple[str, Any, int], str]:
        out: dict[tuple[str, Any, int], str] = {}
        seen: dict[tuple[str, Any], int] = {}  # saves of each (path, step) so far, with tensors or not
        for entry in m.checkpoints:
            key = (entry.path, entry.step)
            occurrence = seen[key] = seen.get(key, -1) + 1
            tensors = entry.raw.get("tensors")
            if isinstance(tensors, str):
                out[(*key, occurrence)] = tensors
        return out

    in_a, in_b = saved(a), saved(b)
    for key, tensors in in_a.items():
        if key in in_b and in_b[key] != tensors:
            path, step, _ = key
            return single_line(f"{path} at step {step}" if step is not None else path)
    return None


def _unseen_state(where: str) -> Cause:
    return Cause(
        f"state the trace does not fingerprint differs: the tensors saved in {where} (weights no optimizer "
        "updates, such as an EMA copy or frozen layers, or buffers such as BatchNorm's running statistics)",
        "every traced facet of every compared step is equal; the fingerprints of the checkpoint's tensors "
        "differ",
        "look for tensors written outside the optimizer and what feeds them; `cascade checkout RUN "
        "--checkpoint PATH --to DIR` gets each run's copy to compare",
    )


def _thinned(comparison: TraceComparison) -> bool:
    """Whether fewer steps were compared than both runs had: a budget thinned their records."""
    return comparison.compared < min(comparison.steps_a, comparison.steps_b)


def _earliest_failure(verdicts: Sequence[Verdict]) -> int | None:
    """The rank whose divergence comes first in causal order (step, then rng → batch → ... → params
    after): in DDP a batch that differs on rank 1 changes every rank's gradients at the same step, and
    rank 1 is the one that says why. Ranks without a step (INCOMPARABLE) come after, rank 0 first."""
    failed = [(rank, v) for rank, v in enumerate(verdicts) if not v.reproduced]
    if not failed:
        return None

    def order(item: tuple[int, Verdict]) -> tuple[int, int, int]:
        rank, v = item
        c = v.comparison
        if c.step is None or not c.differences:
            return (1 << 62, len(FACETS), rank)
        return (c.step, FACETS.index(c.differences[0].facet), rank)

    return min(failed, key=order)[0]


def _ends(a: Manifest, b: Manifest) -> str:
    """How runs that did not finish ended, beside a verdict on their steps: a crash both had alike is
    part of what reproduced."""
    ends = [crashed(a), crashed(b)]
    if ends[0] is not None and ends[0] == ends[1]:
        return f"; both runs ended {ends[0]}: the end reproduced too"
    said = [f"run {m.run_id[:12]} ended {end}" for m, end in zip((a, b), ends, strict=True) if end]
    return f"; {', '.join(said)}" if said else ""


def crashed(manifest: Manifest) -> str | None:
    """`FAILED with exit code 1 (RuntimeError: ...)` for a run that did not finish, else None."""
    outcome = manifest.outcome
    status = outcome.status
    if status in (None, "FINISHED", "RUNNING"):
        return None
    error = error_line(outcome.get("error"), limit=300)
    code = outcome.exit_code  # (none: its parent was lost before the script ended)
    return status + (f" with exit code {code}" if code is not None else "") + (f" ({error})" if error else "")


def with_replay(verdict: Verdict, magnitudes: Sequence[Magnitude], replay: Mapping[str, Any],
                pinned: TraceComparison | None = None,
                records: tuple[Manifest, Manifest] | None = None) -> Verdict:  # fmt: skip
    """The verdict with the magnitudes a replay measured, also in its summary where it diverged, and
    the exact step where the replays pinned one the traces had bracketed: its likely causes ranked
    again from that step (given the two `records`), where they were guesses over the bracket."""
    if pinned is not None:
        causes = verdict.causes if records is None else \
            tuple(likely_causes(records[0], records[1], pinned, list(verdict.differences)))  # fmt: skip
        verdict = replace(verdict, comparison=pinned, causes=causes)
    summary = verdict.summary
    if verdict.verdict == DIVERGED and verdict.comparison.step is not None:
        summary = _where(verdict.comparison, magnitudes)
    return replace(verdict, magnitudes=tuple(magnitudes), replay=dict(replay), summary=summary)


def _where(comparison: TraceComparison, magnitudes: Sequence[Magnitude] = ()) -> str:
    first = comparison.differences[0]
    of = (f"of {min(comparison.steps_a, comparison.steps_b)}, {comparison.compared} recorded by both"
          if _thinned(comparison) else f"of {comparison.compared}")
    parts = [f"DIVERGED at step {comparison.step} ({of}): {FACET_WORDS[first.facet]} {_differ(first.facet)}"]
    if first.names:
        named = single_line(", ".join(first.names[:4]))
        parts.append(f" in {named}" + (" …" if len(first.names) > 4 else ""))
    measured = [m for m in magnitudes if m.facet == first.facet]
    if measured:
        one = len(measured) == 1
        details = [m.detail if one else single_line(f"{m.name}: {m.detail}") for m in measured[:4]]
        parts.append(f" ({'; '.join(details)})")
    if first.facet == "loss":
        parts.append(f" ({first.detail})")
    loss = comparison.loss_first_difference
    loss_said = first.facet != "loss" and loss is not None and loss.step == comparison.step  # (below)
    others = [FACET_WORDS[d.facet] for d in comparison.differences[1:]
              if not (loss_said and d.facet == "loss")]  # fmt: skip
    if others:
        parts.append("; also " + ", ".join(others))
    if first.facet != "loss":
        if loss is None:
            parts.append("; the losses are bitwise equal at every compared step")
        elif loss.step == comparison.step:
            parts.append(f"; the loss differs too ({loss.detail})")
        else:
            equal_at = f"; the loss is equal at step {comparison.step}"
            parts.append(f"{equal_at} and first differs at step {loss.step}: {loss.detail}")
    if comparison.loss_max_rel > 0:
        parts.append(f"; largest relative loss difference {comparison.loss_max_rel:.2g}")
    if comparison.bracket_start is not None:
        parts.append(f"; the weights were last compared before step {comparison.bracket_start}, so it "
                     f"began at a step from {comparison.bracket_start} to {comparison.step}: `cascade verify "
                     "--replay` re-runs both with every facet to pin it")  # fmt: skip
    return "".join(parts)


def _differ(facet: str) -> str:
    return "differs" if facet in ("rng", "batch", "loss") else "differ"  # (gradients, parameters)


def _without_grads(trace: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in record.items() if k != "grads"} for record in trace]
