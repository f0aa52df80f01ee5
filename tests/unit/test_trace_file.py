"""A trace read as lines, parsed where the comparison needs a record (issue 17: verify at 100k steps)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cascade_repro.determinism.compare import compare_traces
from cascade_repro.determinism.trace_file import TraceRecords, equal_prefix
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
        record["batch"] = {"loss": "a batch's own key", "x": "y"}  # before the record's loss: skipped
    a, b = TraceRecords.from_text(_text(first)), TraceRecords.from_text(_text(second))
    lazy, parsed = compare_traces(a, b), compare_traces(first, second)
    assert lazy == parsed and lazy.step == 0 and lazy.loss_max_rel > 0
    assert set(a._parsed) <= {0} and set(b._parsed) <= {0}  # noqa: SLF001 - the first step alone
    assert [b.loss_of(i) for i in range(100)] == [r["loss"] for r in second]
