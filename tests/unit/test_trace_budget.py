"""The trace's sampling schedule (child/trace_budget.py) and what the comparison makes of sampled
traces (determinism/compare.py): a step one side did not fingerprint is not a difference, and a
divergence seen after unsampled steps is bracketed, never placed at a step it may not be at."""

from __future__ import annotations

from typing import Any

import pytest

from cascade_repro.child.trace_budget import (
    MAX_EVERY,
    SamplingBudget,
    parse_budget,
    parse_cost,
    parse_schedule,
)
from cascade_repro.determinism.compare import compare_traces


def test_the_weights_are_read_as_often_as_the_budget_allows_in_powers_of_two() -> None:
    budget = SamplingBudget(0.02)
    for start in (0.0, 0.010, 0.020):  # 10 ms steps
        budget.step_began(start)
    budget.hashed(0.0005)  # 0.5 ms: 5 % of a step, so every 4th step (1.25 %) fits in 2 %
    assert budget.every == 4
    assert [s for s in range(10) if budget.samples(s)] == [0, 4, 8]
    budget.hashed(0.00001)  # cheap: every step
    assert budget.every == 1
    budget.hashed(100.0)  # never fits: as rarely as the schedule goes
    assert budget.every == MAX_EVERY
    assert SamplingBudget(0.0).samples(7) and SamplingBudget(0.5).every == 1


def test_the_cost_is_what_the_trace_took_of_the_time_between_the_first_and_last_steps() -> None:
    budget = SamplingBudget(0.02)
    assert budget.cost() is None  # no step yet
    budget.step_began(10.0, overhead_s=0.5)  # before the first step (its batch, the RNG at its start)
    for step in range(1, 5):  # 2 s steps, each with 0.1 s of the every-step facets ...
        budget.step_began(10.0 + 2 * step, overhead_s=0.1)
    budget.hashed(0.4)  # ... and one sampled step's weights
    budget.setup_s += 0.07  # what the first step did once: apart, in ms, with what came before it
    assert budget.cost() == {"share": (0.4 + 0.4) / 8, "every_step": 0.4 / 8, "sampled": 0.4 / 8,
                             "step_ms": 2000.0, "setup_ms": 570.0}  # fmt: skip
    unbudgeted = SamplingBudget(0.0)  # every facet every step: measured all the same
    unbudgeted.step_began(0.0)
    unbudgeted.step_began(1.0, overhead_s=0.25)
    assert unbudgeted.cost() == {"share": 0.25, "every_step": 0.25, "sampled": 0.0, "step_ms": 1000.0,
                                 "setup_ms": 0.0}  # fmt: skip


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        ({"share": 0.03, "every_step": 0.02, "sampled": 0.01, "step_ms": 2.5, "setup_ms": 40},
         {"share": 0.03, "every_step": 0.02, "sampled": 0.01, "step_ms": 2.5, "setup_ms": 40.0}),
        ({"share": 1, "every_step": 0, "sampled": 1, "step_ms": 3}, {"share": 1.0, "every_step": 0.0,
                                                                      "sampled": 1.0, "step_ms": 3.0,
                                                                      "setup_ms": 0.0}),  # before setup_ms
        ({"share": 0.03, "every_step": 0.02, "sampled": 0.01, "step_ms": 2.5, "setup_ms": "40"}, None),
        ({"share": float("nan"), "every_step": 0.02, "sampled": 0.01, "step_ms": 2.5}, None),
        ({"share": -0.1, "every_step": 0.02, "sampled": 0.01, "step_ms": 2.5}, None),
        ({"share": "3%", "every_step": 0.02, "sampled": 0.01, "step_ms": 2.5}, None),
        ({"share": True, "every_step": 0.02, "sampled": 0.01, "step_ms": 2.5}, None),
        ({"share": 0.03, "every_step": 0.02, "sampled": 0.01}, None),
        ({"share": 1e300, "every_step": 0.02, "sampled": 0.01, "step_ms": 2.5}, None),
        ([0.03, 0.02, 0.01, 2.5], None), (None, None),
    ],
)  # fmt: skip
def test_a_recorded_cost_is_read_as_untrusted_input(given: object, parsed: object) -> None:
    assert parse_cost(given) == parsed


@pytest.mark.parametrize(
    ("given", "parsed"),
    [(0.02, 0.02), (0, 0.0), (1, 1.0), (1.5, None), (-0.1, None), (float("nan"), None), (True, None),
     ("0.02", None), (None, None), ([0.02], None)],
)  # fmt: skip
def test_a_recorded_budget_is_read_as_untrusted_input(given: object, parsed: object) -> None:
    assert parse_budget(given) == parsed


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        ([[0, 1], [2, 1024]], [(0, 1), (2, 1024)]),
        ([[0, 1], [2, 3]], None),  # not a power of two
        ([[0, 1], [2, 2048]], None),  # past MAX_EVERY
        ([[1, 1]], None),  # does not start at step 0
        ([[0, 1], [0, 2]], None),  # steps not ascending
        ([[0, True]], None), ([[0, 1.0]], None), ([[0]], None), ([], None), ("[[0, 1]]", None),
        ([[0, 1]] * 300, None),  # longer than a schedule can be
    ],
)
def test_a_recorded_schedule_is_read_as_untrusted_input(given: object, parsed: object) -> None:
    assert parse_schedule(given) == parsed


def _record(step: int, loss: int = 1, weights: str | None = "w", rng: str = "r") -> dict[str, Any]:
    record: dict[str, Any] = {"step": step, "rng": {"torch": f"{rng}{step}"}, "batch": f"b{step}",
                              "loss": {"bits": loss, "value": float(loss), "dtype": "float32"}}  # fmt: skip
    if weights is not None:
        record["params_after"] = {"0.weight": f"{weights}{step}"}
    return record


def test_a_step_only_one_side_sampled_is_not_a_difference() -> None:
    a = [_record(s, weights="w" if s % 2 == 0 else None) for s in range(8)]
    b = [_record(s, weights="w" if s % 4 == 0 else None) for s in range(8)]
    result = compare_traces(a, b)
    assert (result.step, result.bracket_start) == (None, None)


def test_a_divergence_after_unsampled_steps_is_bracketed_from_the_last_weights_compared() -> None:
    a = [_record(s, weights="w" if s % 4 == 0 else None) for s in range(12)]
    b = [dict(r) for r in a]
    b[7] = _record(7, loss=2, weights=None)  # the loss is the first sign, at an unsampled step
    result = compare_traces(a, b)
    assert (result.step, result.bracket_start) == (7, 5)  # weights agreed after step 4
    sampled_before = [_record(s) for s in range(12)]  # every step sampled: exact
    changed = [dict(r) for r in sampled_before]
    changed[7] = _record(7, loss=2)
    exact = compare_traces(sampled_before, changed)
    assert (exact.step, exact.bracket_start) == (7, None)


def test_an_rng_difference_is_bracketed_by_the_weights_and_an_interval_is_not_bracketed() -> None:
    full = [_record(s) for s in range(6)]
    other = [*full[:3], *[_record(s, loss=2, rng="x") for s in range(3, 6)]]
    assert (compare_traces(full, other).step, compare_traces(full, other).bracket_start) == (3, None)
    sampled = [_record(s, weights="w" if s in (0, 2) else None) for s in range(8)]
    changed = [*sampled[:5], *[_record(s, loss=2, weights=None, rng="x") for s in range(5, 8)]]
    # the RNG differs at step 5, but a weight may have changed at step 3 or 4 unseen
    assert (compare_traces(sampled, changed).step, compare_traces(sampled, changed).bracket_start) == (5, 3)
    every10 = [_record(s) for s in range(0, 60, 10)]  # --trace-interval 10: within 10 steps, as ever
    later = [*every10[:3], *[_record(s, loss=2, rng="x") for s in range(30, 60, 10)]]
    assert (compare_traces(every10, later).step, compare_traces(every10, later).bracket_start) == (30, None)
