"""Records thinned by the trace budget (child/trace_budget.py) where even the every-step facets take
more than half of it, and what the comparison makes of thinned traces (determinism/trace_file.py,
determinism/compare.py): the steps both traces recorded are compared, a divergence seen after steps
without records is bracketed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.api.records import _summarize_trace
from cascade_repro.child.trace_budget import FULL_RECORDS, MAX_EVERY, SamplingBudget
from cascade_repro.determinism.compare import compare_traces
from cascade_repro.determinism.trace_file import TraceRecords, on_common_steps, record_steps


def _run(budget: SamplingBudget, steps: int, recorded_s: float, skipped_s: float, step_s: float = 0.001,
         first: int = 0, now: float = 0.0) -> list[int]:  # fmt: skip
    """Steps of `step_s` whose trace work is `recorded_s` where the step has a record and `skipped_s`
    (the hooks' calls alone) where it has none, from step `first` at `now`: the steps recorded."""
    recorded = []
    for step in range(first, first + steps):
        record = step == 0 or budget.records_step(step)
        budget.step_began(now, recorded_s if record else skipped_s)
        if record:
            recorded.append(step)
            budget.samples(step)
        now += step_s + (recorded_s if record else skipped_s)
    return recorded


def test_records_are_thinned_past_the_first_steps_until_the_trace_fits_half_the_budget() -> None:
    budget = SamplingBudget(0.02)
    # 1 ms steps: 80 µs at a recorded step is 8 % (four times the budget), 4 µs at the others
    recorded = _run(budget, 2000, recorded_s=80e-6, skipped_s=4e-6)
    assert recorded[:FULL_RECORDS] == list(range(FULL_RECORDS))  # the first steps whole
    start, every = budget.records[-1]
    assert budget.records[0] == (0, 1) and start >= FULL_RECORDS and every == 16  # (80 + 15 * 4) / 16 µs
    assert [s for s in recorded if s >= start] == list(range(start, 2000, every))
    assert budget.every >= every  # the weights only where a record is
    average = (80e-6 + (every - 1) * 4e-6) / every
    assert average <= 0.5 * 0.02 * 0.001  # what the trace takes now: within half the budget


def test_records_grow_back_when_the_steps_do_and_never_past_max_every() -> None:
    budget = SamplingBudget(0.02)
    _run(budget, 12000, recorded_s=80e-6, skipped_s=30e-6)  # the hooks alone take more than the budget
    assert budget.records_every == MAX_EVERY
    slow = SamplingBudget(0.02)
    _run(slow, 1000, recorded_s=80e-6, skipped_s=4e-6, step_s=0.1)  # 100 ms steps: nothing to thin
    assert slow.records == [(0, 1)] and slow.records_every == 1
    assert SamplingBudget(0.0).records_step(999)  # budget 0: every facet every step
    shrinking = SamplingBudget(0.02)
    _run(shrinking, 1000, recorded_s=80e-6, skipped_s=1e-6)
    thinned = shrinking.records_every
    _run(shrinking, 6000, recorded_s=2e-6, skipped_s=1e-6, first=1000, now=10.0)  # cheap now: more records
    assert thinned > 1 and shrinking.records_every < thinned


def test_a_records_schedule_handed_back_records_the_same_steps() -> None:
    measured = SamplingBudget(0.02)
    recorded = _run(measured, 1500, recorded_s=80e-6, skipped_s=4e-6)
    replayed = SamplingBudget(0.02, list(measured.schedule), list(measured.records))
    again = _run(replayed, 1500, recorded_s=1e-9, skipped_s=1e-9, step_s=1.0)  # timing plays no part
    assert again == recorded and replayed.records == measured.records


PROGRAM = """
import json, random, sys, numpy, torch
from pathlib import Path
from cascade_repro.child import step_values
from cascade_repro.child.trace import StepTracer

out, budget, given = Path(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
perturb, interval, fail = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
tracer = StepTracer(torch, out / "trace.jsonl", interval, grads=True, budget=budget,
                    schedule=None if given is None else [tuple(e) for e in given["schedule"]],
                    records=None if given is None else [tuple(e) for e in given["records"]])
tracer.install()
reads = {"rng": 0, "batch": 0, "backward": 0}  # what the tracer read, and its backward hook's calls, counted
def counted(name, read):
    def count(*args, **kwargs):
        reads[name] += 1
        return read(*args, **kwargs)
    return count
tracer._rng_states = counted("rng", tracer._rng_states)
step_values.batch_fingerprint = counted("batch", step_values.batch_fingerprint)
tracer.backward_begins = counted("backward", tracer.backward_begins)
torch.manual_seed(0), random.seed(0), numpy.random.seed(0)  # (their states are in the records too)
data = torch.utils.data.TensorDataset(torch.randn(4000, 8), torch.randn(4000, 1))
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
class Failing(torch.optim.SGD):
    def step(self, closure=None):
        if step == fail:
            raise RuntimeError("the optimizer failed")
        return super().step(closure)
opt = Failing(model.parameters(), lr=0.01)
step = 0
try:
    for x, y in torch.utils.data.DataLoader(data, batch_size=8, shuffle=True):  # 500 steps of ~0.1 ms
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step == perturb:
            with torch.no_grad():
                model[0].weight.view(-1)[0] += 0.5  # (the next loss shows it)
        step += 1
except RuntimeError:
    pass
tracer.close()
(out / "header.json").write_text(json.dumps({**tracer.header(), "reads": reads}))
"""


def _traced(tmp_path: Path, budget: float, given: dict[str, Any] | None = None, perturb: int = -1,
            interval: int = 1, fail: int = -1) -> tuple[str, dict[str, Any]]:  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM), str(tmp_path), str(budget),
                    json.dumps(given), str(perturb), str(interval), str(fail)], check=True,
                   timeout=120)  # fmt: skip
    return (tmp_path / "trace.jsonl").read_text(), json.loads((tmp_path / "header.json").read_text())


@pytest.fixture(scope="module")
def thinned(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], str]:
    """A run of 500 short steps under the default budget, and the same run with every facet."""
    text, header = _traced(tmp_path_factory.mktemp("thinned"), 0.02)
    full, _ = _traced(tmp_path_factory.mktemp("full"), 0.0)
    return text, header, full


def test_short_steps_get_records_thinned_and_each_record_is_what_every_step_reads(thinned: Any) -> None:
    text, header, full = thinned
    records = [json.loads(line) for line in text.splitlines()]
    every_step = {r["step"]: r for r in map(json.loads, full.splitlines())}
    assert sorted(every_step) == list(range(500))
    schedule = header["records"]
    assert schedule[0] == [0, 1] and any(every > 1 for _, every in schedule), schedule  # what the record says
    expected = [s for s in range(500) if s % next(e for start, e in reversed(schedule) if start <= s) == 0]
    steps = [r["step"] for r in records]
    assert steps[:FULL_RECORDS] == list(range(FULL_RECORDS))
    assert steps == expected + ([499] if expected[-1] != 499 else []), (steps, schedule)
    for record in records[:-1]:  # each record holds what a trace of every step holds at that step
        alike = every_step[record["step"]]
        assert {k: alike[k] for k in record} == record
    last = records[-1]  # the final weights, always: a record of their own where the step had none,
    if expected[-1] != 499:  # with the step's loss
        assert list(last) == ["step", "params_after", "loss"]
    assert last["params_after"] == every_step[499]["params_after"] and last["loss"] == every_step[499]["loss"]
    assert _summarize_trace(records, header).loss_last == every_step[499]["loss"]["value"]  # show --trace's
    assert header["cost"]["share"] < 0.5  # what it cost is measured as ever (loosely: a loaded machine)
    # nothing read for a step without a record (the RNG state is read as the step before ends: for a
    # step 500 too, which never began, where it would have had one; and once more at the first
    # backward, before any optimizer step says there is an optimizer)
    after_the_last = 500 % schedule[-1][1] == 0
    rng = len(expected) + after_the_last + 1
    # the tracer is called at a step with a record and the step after it (its record is written
    # then) only: the others coast, their hooks count the step
    called = len({s for r in expected for s in (r, r + 1) if s < 500})
    assert header["reads"] == {"rng": rng, "batch": len(expected), "backward": called}, header["reads"]


def test_a_thinned_trace_handed_its_schedules_back_is_the_same_bytes(thinned: Any, tmp_path: Path) -> None:
    text, header, _ = thinned
    given = {"schedule": header["schedule"], "records": header["records"]}
    again, header_again = _traced(tmp_path, 0.02, given)
    assert again == text and header_again["records"] == header["records"]


def test_thinned_and_full_traces_compare_at_the_steps_both_recorded(thinned: Any, tmp_path: Path) -> None:
    text, header, full = thinned
    a, b = TraceRecords.from_text(text), TraceRecords.from_text(full)
    cut_a, cut_b, ran = on_common_steps(a, b)
    assert ran == (500, 500) and record_steps(cut_b) == record_steps(a) == record_steps(cut_a)
    same = compare_traces(cut_a, cut_b, ran, gaps_bracket=True)
    assert (same.step, same.steps_a, same.steps_b, same.compared) == (None, 500, 500, len(a))
    # a weight written at a step without a record: seen at the next record, bracketed from the step
    # after the last one whose weights both traces read
    starts = [s for s, every in header["records"] if every > 1]
    recorded = set(record_steps(a))
    perturbed = next(s for s in range(starts[0], 500) if s not in recorded)
    diverged, _ = _traced(tmp_path / "diverged", 0.0, perturb=perturbed)
    cut_a, cut_b, ran = on_common_steps(a, TraceRecords.from_text(diverged))
    found = compare_traces(cut_a, cut_b, ran, gaps_bracket=True)
    seen_at = min(s for s in recorded if s > perturbed)
    weights_agreed = max(r["step"] for r in map(json.loads, text.splitlines())
                         if "params_after" in r and r["step"] <= perturbed)  # fmt: skip
    assert found.step == seen_at and found.bracket_start == weights_agreed + 1 <= perturbed
    unbracketed = compare_traces(cut_a, cut_b, ran)  # a --trace-interval trace's gaps: no bracket
    assert unbracketed.step == seen_at and unbracketed.bracket_start is None


def test_a_fixed_interval_reads_nothing_at_the_steps_between(thinned: Any, tmp_path: Path) -> None:
    """--trace-interval 7: records at every 7th step, each what a trace of every step holds there (the
    RNG state and batch read for those steps only), no weights at exit for a step without one."""
    _, _, full = thinned
    every_step = {r["step"]: r for r in map(json.loads, full.splitlines())}
    text, header = _traced(tmp_path, 0.02, interval=7)
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["step"] for r in records] == list(range(0, 500, 7)) and header["interval"] == 7
    called = 2 * len(records) - (499 in range(0, 500, 7))  # (see above)
    reads = {"rng": len(records), "batch": len(records), "backward": called}  # (one a record)
    assert header["reads"] == reads, header["reads"]
    assert "budget" not in header  # a fixed interval: every facet at those steps
    for record in records:
        alike = every_step[record["step"]]
        assert {k: alike[k] for k in ("rng", "batch", "loss", "grads")} == {k: record[k] for k in
                                                                            ("rng", "batch", "loss", "grads")}
    # the weights after step k are read when step k+1 begins, the next step's record or not
    assert all(r["params_after"] == every_step[r["step"]]["params_after"] for r in records)


@pytest.mark.parametrize("fail", [301, 256])  # odd: no record there; 256: a record (every <= 256 by then)
def test_an_optimizer_that_fails_leaves_its_weights_as_the_last_step(thinned: Any, tmp_path: Path,
                                                                     fail: int) -> None:  # fmt: skip
    """The optimizer raises at step `fail` (its step hook never returns): the last record is that step's,
    with the weights as they are at exit (those after the step before), after every other record."""
    _, _, full = thinned
    every_step = {r["step"]: r for r in map(json.loads, full.splitlines())}
    text, header = _traced(tmp_path, 0.02, fail=fail)
    records = [json.loads(line) for line in text.splitlines()]
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)) and steps[-1] == fail, (steps[-5:], header["records"])
    assert records[-1]["params_after"] == every_step[fail - 1]["params_after"]
    # the step's loss: its backward ran before its optimizer failed
    assert records[-1]["loss"] == every_step[fail]["loss"]
    if fail % 2:
        assert list(records[-1]) == ["step", "params_after", "loss", "unfinished"]  # its own record


def test_the_next_step_with_a_record_is_the_one_the_schedule_names() -> None:
    """Where the hooks coast to: the first step from a given one that records_step would record."""
    replayed = SamplingBudget(0.02, records=[(0, 1), (3, 4), (10, 8), (21, 2)])
    measured = SamplingBudget(0.02)
    measured.records_every = 16
    for budget in (replayed, measured, SamplingBudget(0.0)):
        recorded = [s for s in range(80) if budget.records_step(s)]
        assert [budget.next_record(s) for s in range(56)] == [min(r for r in recorded if r >= s)
                                                              for s in range(56)]  # fmt: skip
    assert replayed.next_record(3) == 4 and replayed.next_record(9) == 16 and replayed.next_record(17) == 22


def test_steps_told_of_as_a_whole_count_as_that_many_steps() -> None:
    """After coasting, the budget hears of several steps at once: the time per step and the steps
    begun are what they were, told one at a time."""
    one_by_one, at_once = SamplingBudget(0.02), SamplingBudget(0.02)
    for step in range(9):
        one_by_one.step_began(step * 0.002, 10e-6 if step in (0, 8) else 0.0)
    at_once.step_began(0.0, 10e-6)
    at_once.step_began(8 * 0.002, 10e-6, steps=8)
    assert at_once.cost() == one_by_one.cost() and at_once._step_s == pytest.approx(0.002)
