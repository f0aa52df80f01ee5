"""How often the step trace reads the weights and gradients: as often as a cost budget allows.

The cheap facets (RNG state, batch, loss) are recorded every step. Fingerprinting the parameters
(and gradients) is a pass over the model's memory, a fixed cost per step that is a large share of
a short step. With a budget b (`trace_budget`, 0.02: 2 % of the step time) they are fingerprinted
every `every` steps: the smallest power of two with fixed + hash_time / every <= b * step_time,
measured as the run goes: step time from one optimizer step to the next (less the trace's own work
in it), `fixed` what the every-step facets cost, hash time at each sampled step. It grows at once
when the cost does, and shrinks only when a quarter of it would do, so it settles. Sampled steps
are the multiples of `every`, so two runs sampled on other
schedules still share every multiple of the larger. A budget of 0 samples every step.

Where the every-step facets alone take more than half the budget (steps of a few milliseconds
or less: on a fast GPU, a small model), whole records are thinned too: past the first
FULL_RECORDS steps, only every `records_every`-th step (a power of two, up to MAX_EVERY) gets a
record, and the steps between cost the hooks' calls alone (they coast: child/trace.py). It is
judged over windows of steps, from the trace's average cost per step: doubled (or more) while that
exceeds half the budget, halved when a quarter of it would do. The weights are then read at a
multiple of it (`every` >= `records_every`). The last step's weights are read at exit whatever
the schedule, a record of their own where that step has none. `verify` compares the steps both
traces recorded and brackets a divergence seen after steps without records; `--replay` pins it.

The schedules (the step each `every` and each `records_every` began at) are in the trace's header;
a restore hands them back, so a run that reproduces writes the same trace, byte for byte.

Standard library only (this runs inside the training process).
"""

from __future__ import annotations

import math
from typing import Any

MAX_EVERY = 1024  # a divergence is bracketed within this many steps at worst
MAX_CHANGES = 256  # schedule entries kept; past them `every` stays as it is
SMOOTHING = 0.1  # of the step time's running average
OUTLIER = 4.0  # a gap this many times the average step is not a step's time
FULL_RECORDS = 128  # steps with a record each whatever the budget (loss, RNG, batch: a divergence there is
# seen at its step; the weights are read as the budget allows, so one in them alone is bracketed)
THIN_ABOVE = 0.5  # records thinned while the every-step facets take more than this share of the budget
THICKEN_BELOW = 0.125  # ... and twice as many kept when they take less than this share
WINDOW = 32  # steps (times `records_every`, at least) the average is judged over


class SamplingBudget:
    """Which optimizer steps get the expensive facets (weights, gradients)."""

    def __init__(self, budget: float, schedule: list[tuple[int, int]] | None = None,
                 records: list[tuple[int, int]] | None = None) -> None:  # fmt: skip
        self.budget = max(0.0, float(budget))
        self.every = 1
        self.replayed = schedule is not None  # a restore: the recorded schedule, not a measured one
        self.schedule: list[tuple[int, int]] = list(schedule) if schedule is not None else []
        self.records_every = 1
        self.records_replayed = records is not None
        self.records: list[tuple[int, int]] = list(records) if records is not None else [(0, 1)]
        self._window_s = 0.0  # the trace's work over the steps since `records_every` was last judged
        self._window_steps = 0
        # when it is judged next: when step FULL_RECORDS begins (the window counts from step 1), then
        # every WINDOW records; never for a replayed schedule
        self._window_due = FULL_RECORDS - 1 if self.budget > 0 and records is None else math.inf
        self._step_s: float | None = None
        self._fixed_s: float | None = None
        self._last_start: float | None = None
        self._first_start: float | None = None
        self._began = 0  # steps begun
        self.every_step_s = 0.0  # what the trace took over the run: the every-step facets ...
        self.sampled_s = 0.0  # ... and the weights' and gradients' fingerprints at sampled steps
        self.setup_s = 0.0  # what the trace did once, at the first step (its parameters' names)

    def samples(self, step: int) -> bool:
        """Whether `step` gets the weights read (called once per step, in order)."""
        if self.budget <= 0:
            return True
        self.every = _scheduled(self.schedule, self.replayed, self.every, step)
        return step % self.every == 0

    def records_step(self, step: int) -> bool:
        """Whether `step` gets a record (called once per step, in order, as the step before it ends:
        before its batch and RNG state would be read)."""
        if self.budget <= 0:
            return True
        self.records_every = _scheduled(self.records, self.records_replayed, self.records_every, step)
        return step % self.records_every == 0

    def next_record(self, step: int) -> int:
        """The first step from `step` on that gets a record, as the schedule stands (a measured one
        changes only when a window is judged, at a step with a record or the one after it)."""
        if self.budget <= 0:
            return step
        if not self.records_replayed:
            return round_up(step, self.records_every)
        entries = self.records
        for i, (start, every) in enumerate(entries):
            end = entries[i + 1][0] if i + 1 < len(entries) else math.inf
            if end <= step:
                continue
            first = round_up(max(step, start), every)
            if first < end:
                return first
        return step  # (not reached: the last entry holds every step past its start)

    def _judge_records(self) -> None:
        """At the end of a window (`_window_due`): fewer records while the trace's average work per step
        took more than THIN_ABOVE of the budget (as if it all scaled with the records: the hooks' own
        calls at every step are left to the next window), more when twice it would take less than
        THICKEN_BELOW."""
        average = self._window_s / self._window_steps
        self._window_s, self._window_steps = 0.0, 0
        allowed = self.budget * max((self._step_s or 0.0) - average, 1e-9)
        every = self.records_every
        while average * self.records_every / every > THIN_ABOVE * allowed and every < MAX_EVERY:
            every *= 2
        if every == self.records_every and every > 1 and 2 * average <= THICKEN_BELOW * allowed:
            every //= 2
        self.records_every = every
        self.every = max(self.every, every)  # the weights at recorded steps only
        self._window_due = WINDOW * every

    def step_began(self, now: float, overhead_s: float = 0.0, steps: int = 1) -> None:
        """An optimizer step began at `now` (perf_counter seconds), `steps` steps after the last one
        it was told of (more than one after steps that read nothing); the trace's other work since
        then (RNG state, loss, records: every step's, whatever is sampled) took `overhead_s`."""
        fixed, overhead_s, steps = self._fixed_s, max(overhead_s, 0.0), max(steps, 1)
        self._began += steps
        if self._first_start is None:  # what came before the first step (the first batch, backward): once
            self._first_start = now
            self.setup_s += overhead_s
        else:
            self.every_step_s += overhead_s
            self._window_s += overhead_s
            self._window_steps += steps
            if self._window_steps >= self._window_due:
                self._judge_records()
        per_step = overhead_s / steps
        self._fixed_s = per_step if fixed is None else (1 - SMOOTHING) * fixed + SMOOTHING * per_step
        if self._last_start is not None:
            took = (now - self._last_start) / steps
            if self._step_s is None:
                self._step_s = took
            elif took < OUTLIER * self._step_s:  # not an evaluation or a checkpoint between two steps
                self._step_s = (1 - SMOOTHING) * self._step_s + SMOOTHING * took
        self._last_start = now

    def hashed(self, seconds: float) -> None:
        """A sampled step's fingerprints took `seconds`: the interval for the steps that follow."""
        self.sampled_s += seconds
        if self.budget <= 0 or self.replayed or not self._step_s:
            return
        fixed = self._fixed_s or 0.0
        bare_step = max(self._step_s - seconds / self.every - fixed, 1e-9)  # the average holds the trace
        allowed = self.budget * bare_step - fixed  # what the every-step facets leave of the budget
        ideal = 1
        while ideal < MAX_EVERY and seconds / ideal > allowed:
            ideal *= 2
        if ideal > self.every or ideal * 4 <= self.every:
            self.every = max(ideal, self.records_every)  # (a step without a record has no weights read)

    def cost(self) -> dict[str, float] | None:
        """What the trace took, as shares of the time from the first step's start to the last's (the
        training loop's wall time, evaluations and checkpoints in it), and once, at the first step (in
        ms, apart: it is no step's cost), for the record; None before two steps began."""
        if self._first_start is None or self._last_start is None or self._last_start <= self._first_start:
            return None
        span = self._last_start - self._first_start
        every, sampled = self.every_step_s / span, self.sampled_s / span
        return {
            "share": round(every + sampled, 5),
            "every_step": round(every, 5),
            "sampled": round(sampled, 5),
            "step_ms": round(1000 * span / (self._began - 1), 4),
            "setup_ms": round(1000 * self.setup_s, 3),
        }


def round_up(step: int, every: int) -> int:
    """The first multiple of `every` from `step` on."""
    return -(-step // every) * every


def _scheduled(schedule: list[tuple[int, int]], replayed: bool, every: int, step: int) -> int:
    """`every` at `step` (steps come in order): as a replayed schedule has it, or as measured, noted in
    the schedule where it changed (past MAX_CHANGES entries, it stays as the last one has it)."""
    if replayed:
        return next((e for start, e in reversed(schedule) if start <= step), 1)
    if schedule and schedule[-1][1] == every:
        return every
    if len(schedule) < MAX_CHANGES:
        schedule.append((step, every))
        return every
    return schedule[-1][1]


def parse_budget(value: Any) -> float | None:
    """A recorded budget (it may be hostile): a share of step time from 0 to 1, or None."""
    if type(value) in (int, float) and 0 <= value <= 1:  # (NaN fails the range)
        return float(value)
    return None


def parse_cost(value: Any) -> dict[str, float] | None:
    """A recorded `cost` (it may be hostile): its three shares, step time and setup time (absent in
    records made before it was measured: 0), each a finite number from 0 to 1e9, or None."""
    keys = ("share", "every_step", "sampled", "step_ms", "setup_ms")
    if not isinstance(value, dict) or not all(k in value for k in keys[:4]):
        return None
    numbers = [value.get(k, 0.0) for k in keys]
    if not all(type(n) in (int, float) and 0 <= n <= 1e9 for n in numbers):  # (NaN fails the range)
        return None
    return {k: float(n) for k, n in zip(keys, numbers, strict=True)}


def parse_schedule(value: Any) -> list[tuple[int, int]] | None:
    """A schedule as a record holds it ([[step, every], ...]), None unless well formed (it may be
    hostile: steps ascending from 0, each `every` a power of two up to MAX_EVERY)."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_CHANGES:
        return None
    out: list[tuple[int, int]] = []
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 2 and all(type(n) is int for n in entry)):
            return None
        start, every = entry
        if start < (out[-1][0] + 1 if out else 0) or not 1 <= every <= MAX_EVERY or every & (every - 1):
            return None
        out.append((start, every))
    return out if out[0][0] == 0 else None
