"""Verdict logic on hand-written traces and records (the functional tests cover real runs)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from cascade_repro.determinism.trace_file import TraceRecords
from cascade_repro.determinism.verdict import NO_BATCHES, judge
from tests.plugin import as_record


def _record(step: int, loss: float = 1.0) -> dict[str, Any]:
    return {
        "step": step,
        "rng": {"torch": f"r{step}"},
        "batch": f"b{step}",
        "loss": {"bits": int(loss * 1e6), "value": loss, "dtype": "float32"},
        "grads": {"w": f"g{step}"},
        "params_after": {"w": f"p{step}"},
    }


def _manifest(run_id: str, **torch: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "params": {"values": {"lr": 0.1}, "seed": 0},
        "git": {"commit": "c1" * 20},
        "command": {"script": "t.py", "argv": []},
        "determinism": {"mode": "warn"},
        "torch": {"version": "2.13.0", "num_threads": 2, **torch},
        "environment": {},
        "hardware": {"cpu": {"model": "x"}},
        "trace": {"algorithm": "xxh3_64", "interval": 1},
    }


def test_class_a_difference_within_tolerance_is_numerically_equivalent() -> None:
    trace = [_record(i, 1.0 - i / 10) for i in range(5)]
    other = copy.deepcopy(trace)
    for record in other:
        record["grads"]["w"] += "x"
        record["loss"]["bits"] += 1
        record["loss"]["value"] *= 1 + 1e-7
    verdict = judge(
        as_record(_manifest("a")), as_record(_manifest("b", cpu_capability="AVX2")), trace, other, rtol=1e-5
    )
    assert verdict.verdict == "NUMERICALLY_EQUIVALENT"
    assert "cpu_capability None → AVX2" in verdict.summary
    strict = judge(
        as_record(_manifest("a")),
        as_record(_manifest("b", cpu_capability="AVX2")),
        trace,
        other,
        rtol=1e-9,
        atol=0,
    )
    assert strict.verdict == "DIVERGED"


def test_causal_order_reports_the_earliest_facet_first() -> None:
    trace = [_record(i) for i in range(3)]
    other = copy.deepcopy(trace)
    other[1]["batch"] = "changed"
    other[1]["params_after"]["w"] = "changed"
    verdict = judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, other)
    assert verdict.verdict == "DIVERGED"
    assert verdict.comparison.step == 1
    assert verdict.comparison.facets() == ["batch", "params_after"]
    assert "the data differs at step 1" in verdict.causes[0].summary


def test_missing_trace_or_other_algorithm_is_incomparable() -> None:
    trace = [_record(0)]
    assert judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, []).verdict == "INCOMPARABLE"
    other = _manifest("b")
    other["trace"] = {"algorithm": "blake2b_64", "interval": 1}
    verdict = judge(as_record(_manifest("a")), as_record(other), trace, trace)
    assert verdict.verdict == "INCOMPARABLE" and "algorithm" in verdict.summary


def test_diverged_weights_report_how_much_the_loss_moved_later() -> None:
    trace = [_record(i, 1.0 - i / 10) for i in range(6)]
    other = copy.deepcopy(trace)
    other[2]["params_after"]["w"] = "changed"
    for record in other[3:]:
        record["params_after"]["w"] += "x"
        record["loss"]["bits"] += 1
        record["loss"]["value"] += 2.5e-7
    verdict = judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, other)
    assert verdict.verdict == "DIVERGED" and verdict.comparison.step == 2
    first = verdict.comparison.loss_first_difference
    assert first is not None and first.step == 3 and abs(first.absolute - 2.5e-7) < 1e-12
    assert "the loss is equal at step 2 and first differs at step 3" in verdict.summary
    assert verdict.to_dict()["loss_first_difference"]["step"] == 3


def test_steps_limits_the_comparison_to_a_prefix() -> None:
    trace = [_record(i) for i in range(6)]
    other = copy.deepcopy(trace)
    other[4]["params_after"]["w"] = "changed"
    assert (
        judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, other[:5]).verdict
        == "INCOMPARABLE"
    )
    prefix = judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, other, steps=4)
    assert prefix.verdict == "BITWISE_IDENTICAL" and prefix.comparison.compared == 4


def test_traces_with_and_without_gradients_compare_what_both_have() -> None:
    # e.g. the same script on CPU (gradients skipped where not cheap) and on a GPU (hashed)
    trace = [_record(i) for i in range(4)]
    other = [{**r, "grads": None} for r in copy.deepcopy(trace)]
    a, b = _manifest("a"), _manifest("b")
    a["trace"] = {**a["trace"], "grads": True}
    b["trace"] = {**b["trace"], "grads": False}
    result = judge(as_record(a), as_record(b), trace, other)
    assert result.verdict == "BITWISE_IDENTICAL"
    assert result.to_dict()["notes"] == ["gradients are not compared: run b did not hash them (trace_grads)"]
    other[2]["params_after"] = {"w": "changed"}
    result = judge(as_record(a), as_record(b), trace, other)
    assert result.verdict == "DIVERGED" and result.comparison.step == 2
    (cause,) = [c for c in result.causes if "write outside the optimizer" in c.summary]
    assert "nondeterministic backward" in cause.summary and "trace_grads: true" in cause.fix


def test_a_run_that_died_before_its_first_step_is_named_as_a_crash_not_a_trace_setting() -> None:
    """Issue 14.6: a re-run that crashed (FileNotFoundError) was reported as "--trace-interval 0"."""
    trace = [_record(i) for i in range(3)]
    crashed = {
        **_manifest("b" * 32),
        "trace": None,
        "outcome": {"status": "FAILED", "exit_code": 1,
                    "error": {"type": "FileNotFoundError", "message": "data/train.bin"}},
    }  # fmt: skip
    verdict = judge(as_record(_manifest("a" * 32)), as_record(crashed), trace, [])
    assert verdict.verdict == "INCOMPARABLE"
    assert verdict.summary == (
        f"run {'b' * 12} FAILED with exit code 1 (FileNotFoundError: data/train.bin) "
        "before its first traced step"
    )
    untraced = {**_manifest("b" * 32), "trace": None, "outcome": {"status": "FINISHED", "exit_code": 0}}
    assert judge(as_record(_manifest("a" * 32)), as_record(untraced), trace, []).summary == (
        f"run {'b' * 12} has no step trace (recorded with --trace-interval 0)"
    )


def test_a_run_traced_without_a_step_says_where_its_training_went() -> None:
    """torch.multiprocessing.spawn: the script's own process took no optimizer step (its ranks trained
    in processes it started). It said "recorded with --trace-interval 0 or no optimizer"."""
    trace = [_record(i) for i in range(3)]
    spawned = {**_manifest("b" * 32), "trace": {"algorithm": "xxh3_64", "interval": 1, "steps": 0},
               "outcome": {"status": "FINISHED", "exit_code": 0}}  # fmt: skip
    summary = judge(as_record(_manifest("a" * 32)), as_record(spawned), trace, []).summary
    assert summary.startswith(f"run {'b' * 12} recorded no training step: ")
    assert "torch.multiprocessing.spawn" in summary and "torchrun" in summary
    assert "--trace-interval 0" not in summary


def test_batches_fingerprinted_by_one_run_only_compare_the_rest() -> None:
    # a run recorded before cascade read batches that are mappings but not dicts (HF's BatchEncoding)
    trace = [_record(i) for i in range(4)]
    older = [{**r, "batch": None} for r in copy.deepcopy(trace)]
    result = judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, older)
    assert result.verdict == "BITWISE_IDENTICAL"
    assert result.to_dict()["notes"] == [
        "batches are not compared: run b recorded none (recorded before cascade read mappings such as "
        "HF's BatchEncoding?)"]  # fmt: skip
    older[1]["params_after"] = {"w": "changed"}
    result = judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, older)
    assert result.verdict == "DIVERGED" and result.comparison.step == 1
    other = copy.deepcopy(trace)
    other[2]["batch"] = "another"  # both read: a batch that differs is still found
    result = judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, other)
    assert result.verdict == "DIVERGED" and result.comparison.step == 2
    assert [d.facet for d in result.comparison.differences] == ["batch"]


def test_runs_that_read_no_dataloader_say_their_batches_are_not_compared() -> None:
    # nanoGPT's get_batch over a memmap: no batch fingerprint at any step in either run
    trace = [{**_record(i), "batch": None} for i in range(4)]
    result = judge(as_record(_manifest("a")), as_record(_manifest("b")), trace, copy.deepcopy(trace))
    assert result.verdict == "BITWISE_IDENTICAL"
    assert result.to_dict()["notes"] == [NO_BATCHES]
    assert "neither run read its data through a torch DataLoader" in NO_BATCHES
    batched = [_record(i) for i in range(4)]  # both read one: nothing to say
    both = judge(as_record(_manifest("a")), as_record(_manifest("b")), batched, batched)
    assert both.to_dict()["notes"] == []
    # a warm-up step before the first DataLoader batch: the later steps' batches count, as text too
    warmed = [{**batched[0], "batch": None}, *batched[1:]]
    for a, b in ((warmed, copy.deepcopy(warmed)), (_as_text(warmed), _as_text(warmed))):
        assert judge(as_record(_manifest("a")), as_record(_manifest("b")), a, b).to_dict()["notes"] == []
    lines = _as_text(trace)
    assert judge(as_record(_manifest("a")), as_record(_manifest("b")), lines, lines).to_dict()["notes"] == [
        NO_BATCHES]


def _as_text(records: list[dict[str, Any]]) -> TraceRecords:
    """The records as the child writes them, read back as `cascade verify` reads a trace."""
    return TraceRecords([json.dumps(r, separators=(",", ":")) for r in records])


def test_traces_thinned_on_other_schedules_are_judged_at_the_steps_both_recorded() -> None:
    """One run's budget kept every 4th record past step 3, the other's every 2nd: both ran 12 steps.
    Compared where both have a record; a divergence after steps without one is bracketed."""
    full = [_record(i) for i in range(12)]
    final = {"step": 11, "params_after": {"w": "p11"}}  # the final weights' own record
    a = [r for r in full if r["step"] < 4 or r["step"] % 4 == 0] + [final]
    b = [r for r in full if r["step"] < 4 or r["step"] % 2 == 0] + [final]
    for record in (*a, *b):
        if record["step"] % 8 and record["step"] > 3:  # the weights at steps 0-3 and 8 (and at exit) only
            record.pop("params_after", None)
    texts = [TraceRecords([json.dumps(r) + "\n" for r in trace]) for trace in (a, b)]
    same = judge(as_record(_manifest("a" * 32)), as_record(_manifest("b" * 32)), *texts)
    assert same.verdict == "BITWISE_IDENTICAL" and same.comparison.compared == 7  # steps 0-4, 8, 11
    assert same.summary == "the 7 steps both traces recorded (of 12) are bitwise identical"
    stopped = judge(as_record(_manifest("a" * 32)), as_record(_manifest("b" * 32)), a, b[:7])  # b: to step 8
    assert stopped.summary == "the runs have 12 and 9 steps; the 6 steps both recorded in the first 9 are " \
        "bitwise identical"  # fmt: skip
    diverged = copy.deepcopy(b)
    for record in diverged:
        if record["step"] >= 6 and "loss" in record:  # from a step without a record in a: seen at step 8
            record["loss"]["bits"] += 1
    verdict = judge(as_record(_manifest("a" * 32)), as_record(_manifest("b" * 32)), a, diverged)
    assert (verdict.verdict, verdict.comparison.step, verdict.comparison.bracket_start) == ("DIVERGED", 8, 4)
    assert verdict.summary.startswith("DIVERGED at step 8 (of 12, 7 recorded by both): the loss differs")
    assert "from 4 to 8" in verdict.summary


def test_runs_of_different_length_name_the_one_that_was_killed() -> None:
    """A whole run against one stopped by Ctrl-C after 4 steps: "the runs have 6 and 4 steps" said
    nothing of why; the shorter one's end is named (no exit code where none was recorded)."""
    interrupted = {"type": "KeyboardInterrupt", "message": ""}
    killed = {**_manifest("b" * 32), "outcome": {"status": "KILLED", "exit_code": 130, "error": interrupted}}
    a, b = [_record(i) for i in range(6)], [_record(i) for i in range(4)]
    verdict = judge(as_record(_manifest("a" * 32)), as_record(killed), a, b)
    assert verdict.verdict == "INCOMPARABLE"
    assert verdict.summary == (
        f"the runs have 6 and 4 steps (run {'b' * 12} KILLED with exit code 130 (KeyboardInterrupt)); "
        "the first 4 are bitwise identical"
    )
    lost = {**_manifest("b" * 32), "outcome": {"status": "KILLED"}}
    assert f"(run {'b' * 12} KILLED);" in judge(as_record(_manifest("a" * 32)), as_record(lost), a, b).summary


def test_verify_prints_at_most_a_dozen_measured_tensors(capsys: pytest.CaptureFixture[str]) -> None:
    """`verify --replay` at a step where every tensor differs printed one line each (82 for a small
    BERT); the rest are counted, and --json keeps them all."""
    from dataclasses import replace

    from cascade_repro.determinism.magnitude import Magnitude
    from cascade_repro.render import verdicts

    trace = [_record(i) for i in range(3)]
    other = [dict(r) for r in trace]
    other[1] = {**other[1], "params_after": {"w": "changed"}}
    result = judge(as_record(_manifest("a" * 32)), as_record(_manifest("b" * 32)), trace, other)
    measured = tuple(Magnitude("params_after", f"layer{k}.weight", 3, 10, 0.5) for k in range(30))
    verdicts.verdict(replace(result, magnitudes=measured))
    printed = capsys.readouterr().out
    assert printed.count("params_after layer") == 12 and "layer11.weight" in printed
    assert "… and 18 more tensors measured (--json lists every one)" in printed
    assert len(replace(result, magnitudes=measured).to_dict()["first_divergence"]["magnitudes"]) == 30


def test_a_crash_both_runs_had_alike_is_said_beside_their_identical_steps() -> None:
    """Restoring a run that crashed at step 15 said BITWISE_IDENTICAL and no more."""
    failed = {"status": "FAILED", "exit_code": 1, "error": {"type": "RuntimeError", "message": "step 15"}}
    a = {**_manifest("a" * 32), "outcome": failed}
    b = {**_manifest("b" * 32), "outcome": failed}
    trace = [_record(i) for i in range(3)]
    verdict = judge(as_record(a), as_record(b), trace, trace)
    assert verdict.verdict == "BITWISE_IDENTICAL"
    assert verdict.summary == ("all 3 steps are bitwise identical; both runs ended FAILED with exit code 1 "
                               "(RuntimeError: step 15): the end reproduced too")  # fmt: skip
    finished = judge(as_record(_manifest("a" * 32)), as_record(b), trace, trace)
    ended = f"; run {'b' * 12} ended FAILED with exit code 1 (RuntimeError: step 15)"
    assert finished.summary == f"all 3 steps are bitwise identical{ended}"


# -- a trace recorded before a step held all its micro-batches ------------------------------------------
# Before cascade.trace/2 a gradient-accumulation step's record held its last micro-batch and its last
# loss; now it holds every batch (fingerprinted together, `batches: N`) and the sum of its losses with
# each one's bits. A run recorded before, verified against (or restored by) a cascade after, said
# "DIVERGED at step 0: the loss differs" and ranked a false cause.
def _float32(value: float) -> int:
    import struct

    return struct.unpack("<i", struct.pack("<f", value))[0]


def _accumulated(step: int, parts: tuple[float, float]) -> dict[str, Any]:
    record = _record(step)
    record["batch"] = f"both{step}"
    record["loss"] = {"bits": [_float32(p) for p in parts], "value": sum(parts), "dtype": "float32",
                      "parts": 2}  # fmt: skip
    record["batches"] = 2
    return record


def _one_micro_batch(step: int, last: float) -> dict[str, Any]:
    record = _record(step)
    record["batch"] = f"last-micro-batch{step}"
    record["loss"] = {"bits": _float32(last), "value": last, "dtype": "float32"}
    return record


def _formats() -> tuple[Any, Any]:
    old, new = _manifest("a0"), _manifest("b0")
    old["trace"] = {"algorithm": "xxh3_64", "interval": 1, "format": "cascade.trace/1"}
    new["trace"] = {"algorithm": "xxh3_64", "interval": 1, "format": "cascade.trace/2"}
    return as_record(old), as_record(new)


def test_an_accumulation_trace_from_before_compares_on_each_step_s_last_loss_not_its_batches() -> None:
    parts = [(0.25 + i / 8, 0.5 + i / 8) for i in range(6)]
    old = [_one_micro_batch(i, p[1]) for i, p in enumerate(parts)]
    new = [_accumulated(i, p) for i, p in enumerate(parts)]
    manifest_old, manifest_new = _formats()
    for verdict in (judge(manifest_old, manifest_new, old, new), judge(manifest_new, manifest_old, new, old)):
        assert verdict.verdict == "BITWISE_IDENTICAL", verdict.summary
        assert any("one micro-batch" in note and "last loss" in note for note in verdict.comparison.notes)


def test_an_accumulation_trace_from_before_still_finds_a_difference_in_what_both_kept() -> None:
    parts = [(0.25 + i / 8, 0.5 + i / 8) for i in range(6)]
    old = [_one_micro_batch(i, p[1]) for i, p in enumerate(parts)]
    new = [_accumulated(i, p) for i, p in enumerate(parts)]
    new[3]["loss"]["bits"][1] += 1  # the last micro-batch's loss of step 3
    manifest_old, manifest_new = _formats()
    verdict = judge(manifest_old, manifest_new, old, new)
    assert verdict.verdict == "DIVERGED" and verdict.comparison.step == 3
    assert verdict.comparison.facets() == ["loss"]
    single = [_record(i) for i in range(4)]  # steps of one batch: their batches are compared as ever
    changed = [_record(i) for i in range(4)]
    changed[2]["batch"] = "another"
    verdict = judge(manifest_old, manifest_new, single, changed)
    assert verdict.verdict == "DIVERGED" and verdict.comparison.step == 2
    assert verdict.comparison.facets() == ["batch"]
    assert not any("micro-batch" in note for note in verdict.comparison.notes)


def test_two_traces_of_one_format_compare_their_whole_accumulation_steps() -> None:
    parts = [(0.25 + i / 8, 0.5 + i / 8) for i in range(4)]
    a = [_accumulated(i, p) for i, p in enumerate(parts)]
    b = copy.deepcopy(a)
    b[1]["loss"]["bits"][0] += 1  # the first micro-batch's loss: only the new format holds it
    b[1]["loss"]["value"] += 1e-7
    manifest = _formats()[1]
    verdict = judge(manifest, as_record({**_manifest("b1"), "trace": dict(manifest.trace_header)}), a, b)
    assert verdict.verdict == "DIVERGED" and verdict.comparison.step == 1


# -- what the trace does not see: the tensors a checkpoint holds -----------------------------------------
# A tester's GAN kept an EMA copy updated by hand (no optimizer): a one-off write to it gave "all 40
# steps are bitwise identical" while `diff` showed ema.pt's md5 differing.
def _saved(path: str, step: int, tensors: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": path, "step": step, "status": "kept", "md5": "0" * 32}
    if tensors is not None:
        entry["tensors"] = tensors
    return entry


def test_identical_traces_with_checkpoints_holding_other_tensors_are_not_bitwise_identical() -> None:
    trace = [_record(i) for i in range(4)]
    a, b = _manifest("a" * 32), _manifest("b" * 32)
    a["checkpoints"] = [_saved("ckpt/model.pt", 1, "1" * 16), _saved("ema.pt", 3, "2" * 16)]
    b["checkpoints"] = [_saved("ckpt/model.pt", 1, "1" * 16), _saved("ema.pt", 3, "3" * 16)]
    verdict = judge(as_record(a), as_record(b), trace, copy.deepcopy(trace))
    assert verdict.verdict == "DIVERGED" and verdict.exit_status == 3
    assert verdict.summary.startswith("all 4 traced steps are bitwise identical, but the tensors saved in "
                                      "ema.pt at step 3 differ")  # fmt: skip
    assert "the tensors saved in ema.pt at step 3" in verdict.causes[0].summary
    assert "EMA" in verdict.causes[0].summary and "frozen" in verdict.causes[0].summary
    assert verdict.to_dict()["first_divergence"] is None


def test_checkpoints_are_compared_only_where_both_runs_saved_them_with_tensors() -> None:
    """Another path, a step one run never reached (restore --steps), a record from before the field:
    nothing to compare; a timestamp saved beside the tensors never reaches the fingerprint."""
    trace = [_record(i) for i in range(4)]
    a, b = _manifest("a" * 32), _manifest("b" * 32)
    a["checkpoints"] = [_saved("a.pt", 1, "1" * 16), _saved("last.pt", 9, "2" * 16),
                        _saved("old.pt", 2, None)]  # fmt: skip
    b["checkpoints"] = [_saved("b.pt", 1, "5" * 16), _saved("old.pt", 2, "6" * 16)]
    assert judge(as_record(a), as_record(b), trace, copy.deepcopy(trace)).verdict == "BITWISE_IDENTICAL"


def test_a_grad_scaler_run_recorded_before_trace_3_is_incomparable_with_one_recorded_now() -> None:
    """Before cascade.trace/3 a GradScaler run's trace held the scaled loss (times a scale that changes)
    and merged a skipped step into the next: against one recorded now, a false "the loss differs"."""
    trace = [_record(i) for i in range(3)]
    old, new = _manifest("a" * 32), _manifest("b" * 32)
    old["trace"] = {"algorithm": "xxh3_64", "interval": 1, "format": "cascade.trace/2"}
    new["trace"] = {"algorithm": "xxh3_64", "interval": 1, "format": "cascade.trace/3", "grad_scaler": True}
    other = copy.deepcopy(trace)
    other[0]["loss"]["bits"] += 1
    for a, b in ((old, new), (new, old)):
        verdict = judge(as_record(a), as_record(b), trace, other)
        assert verdict.verdict == "INCOMPARABLE" and "GradScaler's scaled loss" in verdict.summary
        assert verdict.summary.startswith(f"run {'a' * 12} was recorded by a cascade")
    plain = {**new, "trace": {**new["trace"], "grad_scaler": False}}  # no scaler: compared as ever
    assert judge(as_record(old), as_record(plain), trace, other).verdict == "DIVERGED"


def test_checkpoints_pair_by_their_save_of_a_path_and_step_even_where_one_has_no_fingerprint() -> None:
    """The second save of ema.pt at step 3 pairs with the other run's second, the first (a record from
    before the field: no fingerprint) with its first; a record from elsewhere with 10,000 saves of one
    path is paired in one pass (the occurrence was counted by scanning every pair made so far)."""
    import time

    trace = [_record(i) for i in range(4)]
    a, b = _manifest("a" * 32), _manifest("b" * 32)
    a["checkpoints"] = [_saved("ema.pt", 3, None), _saved("ema.pt", 3, "1" * 16)]
    b["checkpoints"] = [_saved("ema.pt", 3, "2" * 16), _saved("ema.pt", 3, "1" * 16)]
    assert judge(as_record(a), as_record(b), trace, copy.deepcopy(trace)).verdict == "BITWISE_IDENTICAL"
    a["checkpoints"] = b["checkpoints"] = [_saved("ema.pt", 3, "1" * 16)] * 10_000
    started = time.monotonic()
    assert judge(as_record(a), as_record(b), trace, copy.deepcopy(trace)).verdict == "BITWISE_IDENTICAL"
    assert time.monotonic() - started < 20  # (a loaded machine; quadratic would be minutes)


def test_a_data_file_that_differs_is_named_before_unseeded_randomness_when_the_rng_differs_first() -> None:
    """word_language_model with one word of its git-ignored corpus changed: its vocabulary, so its
    model's shape, so the draws before step 0 differ: "unseeded randomness" came first, though the
    script seeds itself and the data file that differs explains the RNG state by itself."""
    trace = [_record(i) for i in range(3)]
    other = copy.deepcopy(trace)
    for record in other:
        record["rng"]["torch"] += "x"
        record["batch"] += "x"  # another vocabulary: other token ids
        record["params_after"]["w"] += "x"
    a, b = _manifest("a"), _manifest("b")
    a["inputs"] = [{"path": "data/train.txt", "size": 10, "sha256": "1" * 64}]  # git-ignored, read
    b["inputs"] = [{"path": "data/train.txt", "size": 10, "sha256": "2" * 64}]
    verdict = judge(as_record(a), as_record(b), trace, other)
    assert verdict.comparison.step == 0 and verdict.comparison.facets()[0] == "rng"
    summaries = [cause.summary for cause in verdict.causes]
    assert summaries[0].startswith("data differs: data/train.txt"), summaries
    assert not any(s.startswith("unseeded randomness") for s in summaries), summaries
    # the fix for a file neither git nor DVC tracks (it said "dvc checkout", which knows nothing of it)
    assert "dvc checkout" not in verdict.causes[0].fix and "--track-inputs" in verdict.causes[0].fix


def _thinned(full: list[dict[str, Any]], every: int, final_step: int | None) -> list[dict[str, Any]]:
    """`full` as a budget keeps it: every step to 3, then every `every`th, and the final weights."""
    kept = [copy.deepcopy(r) for r in full if r["step"] < 4 or r["step"] % every == 0]
    if final_step is not None and kept[-1]["step"] != final_step:
        kept.append({"step": final_step, "params_after": {"w": f"p{final_step}"}})
    return kept


def test_losses_within_tolerance_are_judged_on_the_steps_both_recorded() -> None:
    """Two machines (a class-A difference: bitwise equality is not expected) thinned their records on
    other schedules: the losses were paired by position (step 8 with step 12) and the pair said
    DIVERGED though every loss agreed within rtol."""
    full = [_record(i, 1.0 - i / 100) for i in range(16)]
    a = _thinned(full, 4, 15)
    b = _thinned(full, 2, 15)
    for record in b:
        record["grads"] = {"w": "other"} if "grads" in record else record.get("grads")
        if "loss" in record:
            record["loss"]["bits"] += 1
            record["loss"]["value"] *= 1 + 1e-7
    other_machine = as_record(_manifest("b" * 32, cpu_capability="AVX2"))
    verdict = judge(as_record(_manifest("a" * 32)), other_machine, a, b, rtol=1e-5)
    assert verdict.verdict == "NUMERICALLY_EQUIVALENT", verdict.summary


def test_a_restore_of_a_prefix_compares_with_a_thinned_original_that_has_no_record_at_its_last_step() -> None:
    """`cascade restore RUN --steps 10` of a 16-step run thinned past step 3: the re-run wrote its final
    weights at step 9, where the original has no record, and the runs were 'INCOMPARABLE: 9 and 10
    steps'. Both ran the first 10 steps: compared where both recorded them."""
    full = [_record(i) for i in range(16)]
    original = _thinned(full, 4, 15)
    rerun = _thinned(full[:10], 4, 9)
    a, b = as_record(_manifest("a" * 32)), as_record(_manifest("b" * 32))
    verdict = judge(a, b, original, rerun, steps=10)
    assert verdict.verdict == "BITWISE_IDENTICAL", verdict.summary
    assert verdict.summary == "the 6 steps both traces recorded in the first 10 (those re-run) are bitwise " \
        "identical"  # fmt: skip
    changed = copy.deepcopy(rerun)
    changed[-2]["loss"]["bits"] += 1  # step 8
    diverged = judge(a, b, original, changed, steps=10)
    assert (diverged.verdict, diverged.comparison.step) == ("DIVERGED", 8)
