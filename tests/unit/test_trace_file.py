"""A trace read as lines, parsed where the comparison needs a record (issue 17: verify at 100k steps)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cascade_repro.determinism.compare import compare_traces
from cascade_repro.determinism.trace_file import TraceRecords, equal_prefix, steps_ended
from cascade_repro.errors import CascadeError


def _step(step: int, loss: float = 1.0, weight: str = "aa") -> dict[str, Any]:
    return {
        "step": step,
        "rng": {"torch": f"{step:016x}"},
        "batch": "b" * 16,
        "loss": {"bits": int(loss * 1000), "value": loss, "dtype": "float32"},
        "grads": {"w": "g" * 16},
        "params_after": {"w": weight},
    }


def _text(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


def test_equal_traces_are_judged_without_parsing_a_record() -> None:
    records = [_step(i, 1.0 / (i + 1)) for i in range(200)]
    a, b = TraceRecords.from_text(_text(records)), TraceRecords.from_text(_text(records))
    result = compare_traces(a, b)
    assert (result.step, result.compared, result.loss_max_rel) == (None, 200, 0.0)
    assert a._parsed == {} and b._parsed == {}  # noqa: SLF001 - what the shortcut saves
    assert result == compare_traces(records, records)  # the same verdict as from parsed records


def test_traces_sampled_on_other_schedules_are_judged_without_parsing_a_record() -> None:
    def sampled(every: int) -> list[dict[str, Any]]:
        records = [_step(i, 1.0 / (i + 1)) for i in range(200)]
        for record in records:
            if record["step"] % every:
                del record["grads"], record["params_after"]
        return records

    a, b = TraceRecords.from_text(_text(sampled(2))), TraceRecords.from_text(_text(sampled(8)))
    result = compare_traces(a, b)
    assert (result.step, result.compared, result.loss_max_rel) == (None, 200, 0.0)
    assert a._parsed == {} and b._parsed == {}  # noqa: SLF001 - what the shortcut saves
    assert result == compare_traces(sampled(2), sampled(8))
    changed = sampled(8)
    changed[16]["params_after"] = {"w": "zz"}  # where both sampled: parsed, found
    lazy = compare_traces(a, TraceRecords.from_text(_text(changed)))
    # the weights were last compared after step 8 (b's schedule): the divergence is in 9..16
    assert (lazy.step, lazy.bracket_start) == (16, 9) and min(a._parsed) == 8  # noqa: SLF001


def test_a_divergence_is_found_and_measured_as_from_parsed_records() -> None:
    first = [_step(i, 1.0 / (i + 1)) for i in range(300)]
    second = [*first[:120], *[_step(i, 1.0 / (i + 1) + 1e-4, "bb") for i in range(120, 300)]]
    a, b = TraceRecords.from_text(_text(first)), TraceRecords.from_text(_text(second))
    assert equal_prefix(a, b, 300) == 120
    lazy, parsed = compare_traces(a, b), compare_traces(first, second)
    assert lazy == parsed and lazy.step == 120 and lazy.loss_max_rel > 0
    # nothing before the first differing line was parsed but the one before it (the step its
    # facets were last compared at: consecutive, so the divergence is exact)
    assert min(a._parsed) == 119 and lazy.bracket_start is None  # noqa: SLF001


def test_a_last_line_cut_short_is_dropped_and_a_damaged_one_is_named() -> None:
    text = _text([_step(0), _step(1)])
    cut = TraceRecords.from_text(text + '{"step":2,"rng":{"tor')
    assert len(cut) == 2 and cut[-1]["step"] == 1 and [r["step"] for r in cut[0:1]] == [0]
    damaged_text = _text([_step(0)]) + "not json\n" + _text([_step(2)])
    damaged = TraceRecords.from_text(damaged_text, "the trace of run x")
    with pytest.raises(CascadeError, match="the trace of run x is damaged at record 2"):
        compare_traces(damaged, TraceRecords.from_text(_text([_step(0), _step(1), _step(2)])))
    with pytest.raises(IndexError):
        cut[2]


def test_losses_of_a_run_diverged_from_its_start_are_read_without_parsing_the_records() -> None:
    first = [_step(i, 1.0 / (i + 1)) for i in range(100)]
    second = [_step(i, 2.0 / (i + 1), "bb") for i in range(100)]
    for record in second[::7]:
        record["batch"] = 'x,"loss":{"bits":1}'  # a look-alike before the record's loss (in a string)
    a, b = TraceRecords.from_text(_text(first)), TraceRecords.from_text(_text(second))
    lazy, parsed = compare_traces(a, b), compare_traces(first, second)
    assert lazy == parsed and lazy.step == 0 and lazy.loss_max_rel > 0
    assert set(a._parsed) <= {0} and set(b._parsed) <= {0}  # noqa: SLF001 - the first step alone
    assert [b.loss_of(i) for i in range(100)] == [r["loss"] for r in second]


HOSTILE = {  # record 6 (step 5) of a trace as a shared store may serve it: what each must be refused as
    "a loss value that is text": ({"loss": {"bits": 5, "value": "abc", "dtype": "float32"}}, "its loss"),
    "a loss value null": ({"loss": {"bits": 6, "value": None}}, "its loss"),
    "a loss without its value": ({"loss": {}}, "its loss"),
    "a loss that is a list": ({"loss": [1, 2]}, "its loss"),
    "bits that are a dict": ({"loss": {"bits": {"a": 1}, "value": 1.0}}, "its loss"),
    "bits of mixed types": ({"loss": {"bits": [1, "x"], "value": 1.0, "parts": 2}}, "its loss"),
    "bits nested": ({"loss": {"bits": [[[1]]], "value": 1.0}}, "its loss"),
    "parts that do not count the bits": ({"loss": {"bits": [1, 2], "value": 1.0, "parts": -1}}, "its loss"),
    "a step that is text": ({"step": "abc"}, "its step is 'abc'"),
    "a negative step": ({"step": -5}, "its step is '-5'"),
    "a step past any run": ({"step": 10**30}, "its step is '1000000000000000000000000000000'"),
    "a superscript digit": ({"step": "²"}, "not a JSON object"),
    "a batch that is a list": ({"batch": [1]}, "its batch"),
    "weights that are a list": ({"params_after": ["x"]}, "its params_after"),
    "a duplicated step": ({"step": 4}, "its step 4 does not follow step 4"),
}


@pytest.mark.parametrize("change", list(HOSTILE))
def test_a_hostile_record_is_named_as_damage_whichever_side_it_is_on(change: str) -> None:
    """Each one gave a traceback-shaped one-line error (ValueError, KeyError, OverflowError ...) that
    named neither the run nor the trace, or a verdict on it ("the loss differs (1.25 vs 1.25)")."""
    edit, named = HOSTILE[change]
    records = [_step(i, 1.0 + i) for i in range(10)]
    hostile = [dict(r) for r in records]
    hostile[5] = {**hostile[5], **edit, "params_after": edit.get("params_after", {"w": "zz"})}
    text = _text(hostile)
    if change == "a superscript digit":
        text = text.replace('"step":"\\u00b2"', '"step":²')
    for a, b in ((records, hostile), (hostile, records)):
        left = TraceRecords.from_text(_text(a) if a is records else text, "the trace of run a")
        right = TraceRecords.from_text(_text(b) if b is records else text, "the trace of run b")
        with pytest.raises(CascadeError, match=f"is damaged at record 6: {named}"):
            from cascade_repro.determinism.verdict import _compare

            _compare(left, right, {"interval": 1})


def test_a_record_nested_past_the_parser_s_depth_is_damage() -> None:
    text = _text([_step(0)]) + '{"step":1,"loss":' + "[" * 100_000 + "]" * 100_000 + "}\n" + _text([_step(2)])
    with pytest.raises(CascadeError, match="is damaged at record 2: not a JSON object"):
        TraceRecords.from_text(text, "the trace of run x")[1]


def test_a_loss_too_large_for_float32_is_compared_without_an_ulp_count() -> None:
    records = [_step(i) for i in range(3)]
    other = [dict(r) for r in records]
    other[1] = {**other[1], "loss": {"bits": 99, "value": 1e300, "dtype": "float32"}}
    result = compare_traces(records, other)
    assert result.step == 1 and "ulp" not in result.differences[0].detail


def test_a_step_one_run_ended_inside_is_compared_on_what_it_began_with() -> None:
    """A run killed inside step 2's optimizer step (its closure): the weights and loss read there are
    not the step's outcome, and the steps it ended are 2, not 3. Its RNG state and batch still are."""
    full = [_step(0, 1.0, "a0"), _step(1, 0.9, "a1"), _step(2, 0.8, "a2")]
    killed = [_step(0, 1.0, "a0"), _step(1, 0.9, "a1"), {**_step(2, 0.85, "a1"), "unfinished": True}]
    assert (steps_ended(full), steps_ended(killed), steps_ended([])) == (3, 2, 0)
    comparison = compare_traces(TraceRecords.from_text(_text(killed)), TraceRecords.from_text(_text(full)))
    assert comparison.step is None and comparison.loss_first_difference is None, comparison
    killed[2]["batch"] = "another"
    comparison = compare_traces(TraceRecords.from_text(_text(killed)), TraceRecords.from_text(_text(full)))
    assert (comparison.step, comparison.facets()) == (2, ["batch"])
    # both ended inside it (an optimizer that raised, in both): compared as recorded
    ended_alike = [*full[:2], {**full[2], "unfinished": True, "params_after": {"w": "other"}}]
    comparison = compare_traces(TraceRecords.from_text(_text(ended_alike)),
                                TraceRecords.from_text(_text(killed)))  # fmt: skip
    assert (comparison.step, comparison.facets()) == (2, ["batch", "loss", "params_after"])
    # a hostile "unfinished" that is not true counts as the step ended
    assert steps_ended([*full[:2], {**full[2], "unfinished": "yes"}]) == 3


def test_a_record_from_someone_else_that_calls_every_step_unfinished_hides_no_difference() -> None:
    """Found by a read of the change: a trace served with `"unfinished": true` on every record and
    step 1's loss changed was judged BITWISE_IDENTICAL against its honest re-run. Only the last step
    both have may have ended in one run and not the other."""
    honest = [_step(0, 1.0, "a0"), _step(1, 0.9, "a1"), _step(2, 0.8, "a2")]
    forged = [{**r, "unfinished": True} for r in honest]
    forged[1] = {**forged[1], "loss": {"bits": 1, "value": 0.5, "dtype": "float32"}}
    comparison = compare_traces(TraceRecords.from_text(_text(forged)), TraceRecords.from_text(_text(honest)))
    assert (comparison.step, comparison.facets()) == (1, ["loss"])
    assert comparison.loss_first_difference is not None and comparison.loss_first_difference.step == 1
