"""The per-step trace, recorded from inside the training process without touching the script
(where it hooks into torch: child/trace_install.py).

A step is one `optimizer.step()` of any torch.optim optimizer (global step hooks), numbered from 0,
or one that mixed precision's GradScaler skipped (inf/NaN gradients: its record says "skipped": true;
its loss is the one the script handed to `scaler.scale`, as for every step; child/trace_install.py).
For step k the record holds, in causal order: the RNG fingerprints at the step's start, the
fingerprint of the last batch a DataLoader yielded (by a loader that fetches one ahead: the one it
handed out), the loss of the last
`backward()` (exact bits), the gradients and the parameters after the step. "After step k" is read
when step k+1 begins, that is at its first `backward()` (while the forward pass has just read the
weights, so they are still in cache), or at its optimizer step when no backward comes first (an
optimizer with a closure), or at exit. A write outside the optimizer (EMA, hook, in-place edit)
between the two steps counts as part of step k. One parameter hash per step serves as both
"after k" and "before k+1".

The weights and gradients are fingerprinted as often as the trace's cost budget allows
(`budget`, child/trace_budget.py; 0: every step), the RNG state, batch and loss every step: a record
without "params_after" (or "grads") is a step that was not sampled. Where those every-step facets
alone exceed half the budget (steps of a few milliseconds or less), the budget thins the records
themselves past the first steps: a step without a record has nothing read (which steps have
records: the header's "records" schedule). Between two records, once the last one is written, the
tracer coasts: its hooks only count the steps up to the next record (`step_hooks`), a few µs a step
where the full path took ~15 (benchmarks/bench_trace_floor.py). The last step's weights are always read
(at exit): where that step has no record, a record of its own holds them ({"step", "params_after"}).
A run that ends inside an optimizer step (killed while a closure ran, or the optimizer raised) has
that step's record say "unfinished": its weights are those at exit, not after the step.
Scripts without an optimizer (below) get every facet every step.

Gradients are hashed "where cheap" by default (child/step_tensors.py).

Records are streamed to `trace.jsonl` (child/trace_writer.py: flushed every half second and at
exit), so a crashed run keeps its prefix. Scripts without an optimizer get one record per
`backward()` (see below).

When a step starts, for its RNG fingerprints: step 0 at the first of these training events, the
script's first DataLoader batch fetch (before the sampler draws its order), its first module
forward, backward or optimizer step; that is after the script's own seeding (`torch.manual_seed`,
`seed_everything`, a restored RNG state), which comes before training. Step k > 0 starts when step
k-1 ended (its optimizer step returned; in manual mode, its backward). A seed the script sets
between a step's start and the moment its record is made (a reseed at each epoch's start) has the
fingerprint read again, so a step's RNG state is the one its training began with
(`reseeded`, called by the hooks on the seeding functions, child/script_seeds.py).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from cascade_repro.child import protocol, step_values, trace_install
from cascade_repro.child.step_tensors import StepTensors
from cascade_repro.child.trace_budget import SamplingBudget, round_up
from cascade_repro.child.trace_dump import TensorDump
from cascade_repro.child.trace_writer import TraceWriter
from cascade_repro.determinism import fingerprint

RNG_EXTRA_EVERY = 16
# Backwards between which the weights changed, before any optimizer step, while an optimizer exists
# (SAM perturbs the weights between its two backwards): taken for a manual update only after these.
MAX_UNDECIDED_UPDATES = 8


class StepTracer:
    def __init__(self, torch: ModuleType, path: Path, interval: int = 1, grads: bool | None = None,
                 stop_after: int | None = None, on_header: Callable[[dict[str, Any]], None] | None = None,
                 budget: float = 0.0, schedule: list[tuple[int, int]] | None = None,
                 records: list[tuple[int, int]] | None = None) -> None:  # fmt: skip
        self.torch = torch
        self.interval = max(1, int(interval))
        # a fixed --trace-interval N > 1 keeps every facet at those steps
        # (a restore hands back the recorded schedule: the same steps sampled, the same trace)
        self.sampling = SamplingBudget(budget if self.interval == 1 else 0.0, schedule, records)
        self._recording = True  # the step about to begin gets a record (the interval's, the budget's choice)
        # Between two records, nothing pending: the hooks only count the steps (`step_hooks`), up to
        # the step before `_coast_until` (the next with a record, or --steps' end); the budget is told
        # of them as a whole when the next step is timed
        self.coasting = False
        self._coast_until = 0
        self._timed_step = -1  # the step the budget was last told began
        # (step, its one-element losses backpropagated, in order: several with gradient accumulation,
        # an optimizer closure's last only) for the last step that had one, and the one before
        self.last_backward: tuple[int, list[Any]] = (-1, [])
        self.backward_before: tuple[int, list[Any]] = (-1, [])
        # (step, where the losses of its optimizer's closure begin in its list), from the closure's
        # first backward (child/trace_install.py)
        self.closure_from: tuple[int, int] = (-1, 0)
        self.scaled: tuple[Any, Any] | None = None  # a GradScaler's last (scaled loss, the loss it scaled)
        self.skipping = False  # a GradScaler skipped the optimizer's step: it ends through the hooks, marked
        self.grad_scaler = False  # a GradScaler scaled a loss: the header says so (trace_formats.py)
        self.backwards = 0  # backward() calls so far
        self._last_optimizer: Any = None  # the last step's (its weights are read at exit)
        self._last_recorded = -1  # the last step that got a record
        self._stopped = False  # something the trace read failed: nothing more is read
        self._stopped_at: dict[str, Any] | None = None  # where and why (the header says so)
        self._pending_sampled = True  # the pending step gets its weights (and gradients) read
        self._hash_s = 0.0  # what fingerprinting the pending step's tensors took so far
        self._spent_s = 0.0  # time inside the hooks since the last step began ...
        self._hashing_s = 0.0  # ... and the part of it that fingerprinted weights and gradients
        # names, fingerprints, the gradients' rule; read every step (no budget timing them), device
        # fingerprints stay on the device until the trace is written: no wait for it at each step
        self.tensors = StepTensors(torch, grads, defer=self.sampling.budget <= 0)
        self._on_header = on_header  # told when the header changes (the gradient decision)
        self.stop_after = stop_after  # end the script (exit 0) when this step would begin
        self._writer = TraceWriter(torch, path)  # closed in close()
        self._lock = threading.Lock()
        self.step = 0
        self._pending: dict[str, Any] | None = None  # step k, waiting for its params-after
        self._pending_params: list[Any] | None = []  # None: read from `_pending_optimizer` if needed
        self._pending_optimizer: Any = None
        self._optimizers_named: set[int] = set()  # optimizers whose parameters were checked for names
        # the batches the step trained on so far (gradient accumulation: several, `both_batches`)
        self.batch: str | fingerprint.Later | None = None  # Later: on a device, read at the flush
        self._batch_last: str | fingerprint.Later | None = None  # the last one read, alone
        self._batch_open = False  # the next batch read adds to `batch` (same loader, same step)
        self._batch_source: object = None  # the loader's iteration that read the last one
        self._batches = 0  # how many batches `batch` covers (a record says so where several)
        self._unrecorded = False  # weights updated by hand: this step's backward ran, without a record
        self.batch_sums: dict[Any, Any] = {}  # a device's checksums of the batches, kept (their plan)
        self._started = False  # step 0 has started: its RNG state is read (see the docstring)
        self._rng: dict[str, Any] | None = None
        self._rng_states = step_values.RngStates(torch)
        self.closed = False
        self._mode = "undecided"  # "optimizer" or "manual" once known
        self.optimizers_made = 0  # torch optimizers constructed (child/trace_install.py)
        self._undecided_updates = 0  # weights changed between backwards while an optimizer exists
        self._manual: list[Any] = []
        self._rng_next: dict[str, Any] | None = self._rng
        self.in_step = False  # between an optimizer step's pre- and post-hook
        self.step_takes_args = False  # the step under way was given arguments (a closure)
        self._post_hook: Callable[[Any, Any, Any], None] = lambda optimizer, args, kwargs: None
        self._backward_in_step = False  # the step ran a closure: its loss and gradients come after
        self.dump: TensorDump | None = None  # `cascade verify --replay`: steps whose tensors are saved
        # told once, at the first backward() or optimizer step: the training began (not at a first
        # forward or batch, which a script may take to look at them before its configuration is done)
        self.on_training_begins: Callable[[], None] | None = None

    # -- entry points (child/trace_install.py calls them from torch) -----------------------------
    def install(self) -> None:
        trace_install.install(self)

    def step_hooks(self) -> tuple[Callable[[Any, Any, Any], None], Callable[[Any, Any, Any], None]]:
        """The optimizer step's global pre- and post-hook. While coasting (most steps, where the budget
        thinned the records) they count the step and note its optimizer, nothing else: a few
        attribute writes, no clock read, no lock (the hooks' own cost at such a step is then not in
        the trace's measure of itself, only in benchmarks/bench_trace_floor.py's)."""
        before, after = self._guarded(self._before_step), self._guarded(self._after_step)
        # An optimizer stepped inside another's step (Lookahead's base optimizer, SAM's) is part of that
        # step: its hooks are left out (they counted every iteration twice).

        def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self.in_step:
                if optimizer is not self._last_optimizer:
                    return
                self.step_never_returned()  # its last step raised, and the script went on
            # given a closure, most likely (torch hands the optimizer itself as the first argument)
            self.step_takes_args = bool(kwargs) or len(args) > (1 if args and args[0] is optimizer else 0)
            if self.coasting:
                self.in_step = True
                self._last_optimizer = optimizer
                return
            before(optimizer, args, kwargs)

        def post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if optimizer is not self._last_optimizer and self.in_step:
                return
            if self.coasting:
                if self.step + 1 < self._coast_until:
                    self.in_step = False
                    self.step += 1
                    return
                self.coasting = False  # the next step has a record: this one ends the full way
            after(optimizer, args, kwargs)

        self._post_hook = post_hook
        return pre_hook, post_hook

    def step_never_returned(self) -> None:
        """The step under way never returned: its optimizer raised, and the script went on (a batch
        skipped after an out-of-memory error). Told at the next sign of another step (that optimizer's
        next step, or a backward() outside any closure), it ends then, as if it had returned: one step,
        its record "unfinished" (as a step a run ended inside: its weights are read when the next
        begins, as they are then)."""
        pending = self._pending
        if pending is not None and pending["step"] == self.step:
            pending["unfinished"] = True
        self._post_hook(self._last_optimizer, (), {})

    def backward_begins(self, tensors: Any) -> None:
        if self.on_training_begins is not None:  # (before the clock: set-up, no step's cost)
            self._training_begins()
        started = time.perf_counter()
        if not self._started:
            self.start()
        if self._mode == "optimizer":
            self._guarded_next_step_begins()
        else:
            self._guarded_manual(self._before_backward)
        self._spent_s += time.perf_counter() - started

    def read_batch(self, batch: Any, source: object = None) -> None:
        """A DataLoader's iteration `source` handed out `batch` to be trained on: its fingerprint, timed
        as part of what every step costs. The step's batch is every batch one iteration handed out
        since the last step's record (gradient accumulation: several); another iteration's batch
        (validation between steps, the next epoch's loader) starts it again."""
        if not self._recording:
            return
        started = time.perf_counter()
        try:  # a failing fingerprint never reaches the training loop
            taken = step_values.batch_fingerprint(self.torch, batch, self.batch_sums)
            if self._batch_open and source is self._batch_source:
                if taken is not None:  # (a micro-batch without tensors adds nothing)
                    self.batch = step_values.both_batches(self.batch, taken)
                    self._batches += 1
            else:
                self.batch, self._batches = taken, int(taken is not None)
            self._batch_last, self._batch_open, self._batch_source = taken, True, source
        except Exception as exc:
            self.stop(exc)
        self._spent_s += time.perf_counter() - started

    def backward_ended(self) -> None:
        if self._mode != "optimizer":
            started = time.perf_counter()
            self._guarded_manual(self._after_backward)
            if self._mode == "undecided":  # before the first optimizer step: once (the names looked up)
                self.sampling.setup_s += time.perf_counter() - started

    def _training_begins(self) -> None:
        """The first backward() or optimizer step: `on_training_begins` is told, once (outside the
        clock of the hooks, or in step 0's pre-hook, set-up as a whole); what it raises never stops
        the trace."""
        told, self.on_training_begins = self.on_training_begins, None
        try:
            if told is not None:
                told()
        except Exception:
            pass

    def start(self) -> None:
        """Step 0 starts, if it has not (its RNG state is read now)."""
        if self._started or self.closed:
            return
        try:
            with self._lock:
                self._start()
        except Exception as exc:
            self.stop(exc)

    def _start(self) -> None:
        """Step 0 starts: its RNG state is read now, after the script's own seeding."""
        if not self._started:
            self._started = True
            self._rng = self._rng_next = self._rng_fingerprint()

    def reseeded(self) -> int | None:
        """The script seeded a generator: the step whose RNG fingerprint is the first to follow it.

        If that step's record is not made yet, its fingerprint is read again now."""
        if self.closed:
            return None
        try:
            with self._lock:
                if not self._started:
                    return 0  # step 0's state is read when it starts
                if self.in_step:  # a closure reseeding: the next step's start follows it
                    return self.step + 1
                fresh = self._rng_fingerprint()
                if self._mode != "optimizer" and (self._pending is not None or self._unrecorded):
                    self._rng_next = fresh  # step k's record is made; step k+1 starts at the next backward
                    return self.step + 1
                if self._pending is not None and self._pending["step"] >= self.step:
                    return self.step + 1
                self._rng = fresh
                return self.step
        except Exception as exc:
            self.stop(exc)
            return None

    def last_step(self) -> int | None:
        """The last step whose update is done (a checkpoint saved now is its); None before the first.
        By hand, step k ends at the next backward(): its update is done once its backward ran."""
        by_hand = self._mode != "optimizer" and (self._pending is not None or self._unrecorded)
        done = self.step if by_hand else self.step - 1
        return done if done >= 0 else None

    def _guarded(self, hook: Any) -> Any:
        """A failing fingerprint turns the trace off; it never reaches the user's training loop."""

        def run(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self.closed:
                return
            started = time.perf_counter()
            try:
                hook(optimizer, args, kwargs)
            except Exception as exc:
                self.stop(exc)
            self._spent_s += time.perf_counter() - started

        return run

    def _guarded_manual(self, hook: Any) -> None:
        if self.closed or self._mode == "optimizer":
            return
        try:
            with self._lock:
                hook()
        except Exception as exc:
            self.stop(exc)

    def _guarded_next_step_begins(self) -> None:
        if self.in_step:  # a closure's backward(), inside the optimizer step
            self._backward_in_step = True
            return
        pending = self._pending
        if self.closed or pending is None:
            return
        try:
            if not self._pending_sampled and self.dump is None:  # nothing to read: most steps
                self._pending = None
                self._writer.write(pending)
                return
            with self._lock:
                self._finish_pending()
        except Exception as exc:
            self.stop(exc)

    def _finish_pending(self, final: bool = False) -> None:
        """Step k's parameters-after, read when step k+1 begins (or at exit: the final weights, always),
        if step k is sampled; the record is complete then."""
        if self._pending is not None:
            if final and self.in_step and self._pending["step"] == self.step:  # a step that never returned
                self._pending["unfinished"] = True  # (its weights: at exit, not after it; `_final_weights`)
                if self._pending["loss"] is None:
                    self._pending["loss"] = self._loss_copy(self._pending["step"])
            if self._pending_sampled or final:
                self._wait_for_devices()
                started = time.perf_counter()
                self._pending["params_after"] = self.tensors.params(self._params_pending())
                took = time.perf_counter() - started
                self._hashing_s += took
                if not final:  # (the final weights: read after the last step, outside the loop)
                    self.sampling.hashed(self._hash_s + took)
            if self._dumps(self._pending["step"]):
                self._save_dump(self._pending["step"], "params_after", self._params_pending())
            self._writer.write(self._pending)
            self._pending = None

    def _params_pending(self) -> list[Any]:
        """The pending step's parameters (its optimizer's, read only when needed)."""
        if self._pending_params is None:
            self._pending_params = _params_of(self._pending_optimizer)
        return self._pending_params

    def _dumps(self, step: int) -> bool:
        return self.dump is not None and self.dump.wants(step)

    def _save_dump(self, step: int, facet: str, params: list[Any], grads: bool = False) -> None:
        """The tensors of this step (parameters before and after it, gradients) for `cascade verify
        --replay` to measure how far two runs are apart there (child/trace_dump.py)."""
        assert self.dump is not None
        self.dump.add(step, facet, self.tensors.copies(params, grads))

    # Scripts that update weights by hand (no torch.optim) get one record per backward(). The mode
    # is decided at the second backward: an optimizer step before it means "optimizer"; weights
    # that changed since the first backward mean "manual"; unchanged weights (gradient
    # accumulation, a backward for analysis) leave it undecided and the first record is dropped.
    def _before_backward(self) -> None:
        if self._unrecorded:  # a step --trace-interval N leaves without a record: it counts
            self._unrecorded = False
            self.step += 1
            if self.step % self.interval == 0:
                self._rng = self._rng_next
            self._stop_if_done()
            return
        if self._pending is None:
            return
        params = self._manual_params()
        after = self.tensors.params(params, now=self._mode == "undecided")  # compared below
        if self._mode == "undecided":
            if after == self._pending.get("params_before"):
                self._pending = None
                return
            if self.optimizers_made and self._undecided_updates < MAX_UNDECIDED_UPDATES:
                self._undecided_updates += 1  # an optimizer exists: SAM's perturbation before its step
                self._pending = None  # (the optimizer's first step starts step 0 afresh)
                return
            self._mode = "manual"
            if not self.tensors.scanned:  # a manual record holds every live module's parameters, once
                self._manual = params = self.tensors.look_up_names(scan=True)
                after = self.tensors.params(params)
        self._pending["params_after"] = after
        if self.step != 0:
            self._pending.pop("params_before", None)
        if self._dumps(self.step):
            self._save_dump(self.step, "params_after", params)
        self._writer.write(self._pending)
        self._pending = None
        self.step += 1
        self._rng = self._rng_next
        self._stop_if_done()

    def _after_backward(self) -> None:
        params = self._manual_params()
        if not params:
            return
        if self._mode == "manual" and self.step % self.interval:  # (--trace-interval N)
            self._unrecorded = True
            if (self.step + 1) % self.interval == 0:  # the next step has a record: its RNG state
                self._rng_next = self._rng_fingerprint()
            return
        self._decide_grads(params)
        record = self._new_record(params)
        if self._mode == "undecided":
            record["params_before"] = self.tensors.params(params, now=True)  # compared at the next backward
        if self._dumps(self.step):
            self._save_dump(self.step, "params_before", params)
            self._save_dump(self.step, "grads", params, grads=True)
        self._pending = record
        self._pending_params = params
        self._pending_sampled = True
        if (self.step + 1) % self.interval == 0:  # the next step has a record
            self._rng_next = self._rng_fingerprint()  # it starts after this update

    def _manual_params(self) -> list[Any]:
        if not self.tensors.named:
            self._manual = self.tensors.look_up_names()
        return self._manual

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        hook_began = time.perf_counter()
        skipped = not self._recording and self._pending is None and not self.stop_after
        if skipped and self._mode == "optimizer":  # most steps where the budget thinned the records:
            self.in_step = True  # all `_step_begins` does for them (nothing pending, nothing to end)
            self._step_timed(optimizer, hook_began)
            return
        with self._lock:
            if self.closed:
                return
            self._step_begins()
            self._step_timed(optimizer, time.perf_counter())
            if not self._recording:
                return
            self._last_recorded = self.step
            dumping = self._dumps(self.step)
            sampled = self.sampling.samples(self.step) or dumping
            # the parameter list only where it is read now: most steps read nothing of it
            undecided = self.tensors.grads is None
            params = _params_of(optimizer) if sampled or undecided or self.step == 0 else None
            if params is not None and id(optimizer) not in self._optimizers_named:  # once, where read
                self._name_every_parameter(optimizer, params)
            if undecided:
                self._decide_grads(params or [])
            record = self._new_record(params or [], sampled)
            if self.step == 0:
                record["params_before"] = self.tensors.params(params or [])
            if dumping:
                self._save_dump(self.step, "params_before", params or [])
                self._save_dump(self.step, "grads", params or [], grads=True)
            self._pending = record
            self._pending_optimizer = optimizer
            self._pending_params = params
            self._pending_sampled = sampled
            if self.step == 0:
                self._count_as_setup(time.perf_counter() - hook_began)

    def _step_timed(self, optimizer: Any, now: float) -> None:
        """A step begins at `now`: the budget is told what the hooks took since the last step it was told
        of (the weights' fingerprints apart), and how many steps that was (more than one after
        coasting); its optimizer's weights are the final ones if it is the last."""
        steps, self._timed_step = self.step - self._timed_step, self.step
        self.sampling.step_began(now, self._spent_s - self._hashing_s, steps)
        self._spent_s = self._hashing_s = 0.0
        self._last_optimizer = optimizer

    def _name_every_parameter(self, optimizer: Any, params: list[Any]) -> None:
        """An optimizer's parameters read for the first time: where the modules the script built do
        not name them all (a model unpickled, a parameter in no module), every live module is
        scanned for them. Done once: set up, no step's cost (step 0's hook is set-up as a whole)."""
        self._optimizers_named.add(id(optimizer))
        started = time.perf_counter()
        if not self.tensors.names_cover(params):
            self.tensors.look_up_names(scan=True)
        if self.step != 0:
            self._count_as_setup(time.perf_counter() - started, whole_hook=False)

    def _count_as_setup(self, seconds: float, whole_hook: bool = True) -> None:
        """What is done once (the parameters' names looked up among every live object; with
        `whole_hook`, step 0's pre-hook as a whole: the gradients' rule decided, the weights before
        step 0 read as well): no step's cost, for the budget or the record, but the setup's."""
        self._spent_s -= seconds  # (`_guarded` adds the hook's whole time when it returns)
        if whole_hook:
            self._hashing_s = 0.0
        self.sampling.setup_s += seconds

    def _step_begins(self) -> None:
        """An optimizer step begins: the mode is "optimizer"; a step still pending (an optimizer with
        a closure: no backward() since the last step) is complete; `--steps` may end the script."""
        if self._mode != "optimizer":
            if self._mode == "undecided":
                self._pending = None  # a manual-mode guess from the first backward(s)
            self._mode = "optimizer"
        if self.on_training_begins is not None:
            self._training_begins()
        if not self._started:
            self._start()
        if not self.tensors.named:  # once: a script with no nn.Module must not rescan every step
            self.tensors.look_up_names()
        self.in_step = True
        if self._pending is not None:
            self._finish_pending()
        if self.stop_after is not None:
            self._stop_if_done()

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with self._lock:
            self.in_step = False
            pending = self._pending
            ended = self.step
            self.step += 1
            self._recording = self.step % self.interval == 0 and self.sampling.records_step(self.step)
            if self._recording:
                self._rng = self._rng_fingerprint()  # the next step starts now
            else:  # (nothing of it read: no batch of another step in its place either)
                self._rng = self.batch = self._batch_last = None
                self._batch_open = False
            if pending is not None and pending["step"] == ended:
                # the step's loss is read here, beside the RNG state, rather than in the pre-step hook:
                # a second read in one hook costs a fraction of the first (the step has evicted the
                # code from cache)
                pending["loss"] = self._loss_copy(ended)  # a closure's: its last
                if self._backward_in_step:  # the closure's gradients
                    if self._pending_sampled:
                        params = self._params_pending()
                        pending["grads"] = self.tensors.gradients(params) if self.tensors.grads else None
                    if self._dumps(ended):
                        self._save_dump(ended, "grads", self._params_pending(), grads=True)
            self._backward_in_step = False
            if not self._recording and self._pending is None and self.dump is None and not self.closed:
                self._coast()

    def _coast(self) -> None:
        """The step about to begin has no record and nothing is pending: coast up to the next with one."""
        if self.interval > 1:
            until = round_up(self.step, self.interval)
        else:
            until = self.sampling.next_record(self.step)
        if self.stop_after is not None:
            until = min(until, self.stop_after)
        self._coast_until = until
        self.coasting = until > self.step

    def close(self) -> None:
        """At exit: the last step's parameters-after are the final weights."""
        with self._lock:
            if self._writer.closed:
                return
            self.closed, self.coasting = True, False
            try:
                self._finish_pending(final=True)
                self._final_weights()
                self._writer.close()
            except Exception as exc:  # a device that can no longer be read (a CUDA error in the script)
                self._writer.abandon()
                self.stop(exc)
            if self._on_header is not None:
                self._on_header(self.header())  # the schedule as it ended, what the trace cost

    def _final_weights(self, final: int | None = None) -> None:
        """The last step had no record (the budget thinned them): its weights, read now, and its loss (that
        of its last backward, if any) make one. The last step is the last that began: one whose
        optimizer failed or was interrupted (its step hook never returned) too. Its record says
        "unfinished": the weights are those at exit, inside the step (before its update, or partway
        through one: a closure's optimizer is inside its step most of the time), not after it, and the
        run ended that many steps (`trace_file.steps_ended`: a killed run's restore re-runs those)."""
        last = self._last_optimizer
        unfinished = final is None and self.in_step
        if final is None:
            final = self.step if self.in_step else self.step - 1
        # (--trace-interval N: records at every Nth step, as it says)
        if last is None or self._last_recorded >= final or self._stopped or self._mode != "optimizer" \
                or self.interval != 1:  # fmt: skip
            return
        self._wait_for_devices()
        record: dict[str, Any] = {"step": final, "params_after": self.tensors.params(_params_of(last))}
        for step, losses in (self.last_backward, self.backward_before):  # (the last step's backward, or
            if step == final and losses:  # the next's, begun and cut short: Ctrl-C before its optimizer)
                record["loss"] = step_values.losses_now(self.torch, losses)  # (`show --trace` ends on it)
                break
        if unfinished:
            record["unfinished"] = True
        self._writer.write(record)

    def _stop_if_done(self) -> None:
        """`cascade restore --steps N`: steps 0..N-1 are complete, so end the script as a success.

        SystemExit passes the hooks' guards and the script's `except Exception`; atexit handlers
        (the run's facts, this file) still run.
        """
        if self.stop_after is None or self.step < self.stop_after:
            return
        self.closed = True
        self._final_weights(self.step - 1)  # as at exit: the last step's, where it has no record
        self._writer.close()
        sys.stderr.write(f"cascade: stopped after {self.step} steps, as the restore asked (the recorded "
                         "run's steps, or --steps)\n")  # fmt: skip
        raise SystemExit(0)

    # -- pieces -----------------------------------------------------------------------------
    def _decide_grads(self, params: list[Any]) -> None:
        if self.tensors.decide_grads(params) and self._on_header is not None:
            self._on_header(self.header())

    def _new_record(self, params: list[Any], sampled: bool = True) -> dict[str, Any]:
        """Step k up to its gradients (a sampled step's); "params_after" is added when step k+1 begins."""
        manual = self._mode != "optimizer"  # (a backward is a step: its batch and loss alone)
        record = {
            "step": self.step,
            "rng": self._rng,
            "batch": self._batch_last if self._mode == "manual" else self.batch,
            "loss": self._manual_loss() if manual else None,  # optimizer: `_after_step`
        }
        if self._batches > 1 and self._mode != "manual" and record["batch"] is not None:
            record["batches"] = self._batches  # (a trace from before them: determinism/trace_formats.py)
        if self.skipping:  # (before the sampled facets: compared wherever the two records are)
            record["skipped"] = True
        if self._mode != "undecided":  # (undecided: the first optimizer step may be yet to come)
            self._batch_open = False
        self._hash_s = 0.0
        if sampled:
            self._wait_for_devices()
            started = time.perf_counter()
            record["grads"] = self.tensors.gradients(params) if self.tensors.grads else None
            self._hash_s = time.perf_counter() - started
            self._hashing_s += self._hash_s
        return record

    def stop(self, exc: Exception) -> None:
        """Something the trace reads failed: the trace stops there, saying so; the training goes on."""
        if not self._stopped:  # (said once: closing it at exit may meet the same failure)
            sys.stderr.write(f"cascade: the step trace stopped at step {self.step}: {exc!r}\n")
            self._stopped_at = {"step": self.step, "error": f"{type(exc).__name__}: {exc}"[:300]}
            if isinstance(exc, OSError) and exc.errno in protocol.FULL_DISK:  # (the record is incomplete)
                self._stopped_at["full_disk"] = True
        self.closed = self._stopped = True
        # it coasts to the end: the hooks go on counting the steps (a checkpoint's step), nothing more
        self.coasting, self._coast_until = True, sys.maxsize
        self._pending = None

    def _wait_for_devices(self) -> None:
        """Before a sampled step's fingerprints are timed for the budget: an accelerator finishes the
        work the step queued first (the forward pass), or the copy back would wait for it inside the
        timing, and the budget would take the forward's time for the fingerprints' and sample too
        rarely. The wait counts as neither the fingerprints' cost nor the every-step facets'.
        (Where every step is read, nothing is timed and nothing waits: `StepTensors.defer`.)"""
        if self.tensors.defer:
            return
        started = time.perf_counter()
        self.tensors.wait_for_devices()
        self._hashing_s += time.perf_counter() - started

    def _loss_copy(self, step: int) -> Any:
        """Step `step`'s loss as it is now (a script may reuse its memory, a buffer of losses, later):
        the sum of those it backpropagated, each one's bits kept (`step_values.losses_now`)."""
        recorded, losses = self.last_backward
        return step_values.losses_now(self.torch, losses) if recorded == step and losses else None

    def _manual_loss(self) -> Any:
        """Without an optimizer, each backward() is a step: its loss alone (or none)."""
        losses = self.last_backward[1]
        return step_values.loss_now(self.torch, losses[-1]) if losses else None

    def _rng_fingerprint(self) -> dict[str, Any]:
        """torch's generators every step; Python's and numpy's (slower to read: ~50 µs together
        between steps) at step 0 and every RNG_EXTRA_EVERY steps, where unseeded randomness shows
        first."""
        return self._rng_states(others=self.step % RNG_EXTRA_EVERY == 0)

    def header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"algorithm": fingerprint.ALGORITHM, "interval": self.interval}
        if self.sampling.budget > 0:  # a record without them is a step that was not sampled
            header["budget"] = self.sampling.budget
            header["sampled"] = ["grads", "params_after"]
            header["schedule"] = [list(entry) for entry in self.sampling.schedule]  # [step, every] from it on
            header["records"] = [list(entry) for entry in self.sampling.records]  # the steps with a record
        header["grads"] = self.tensors.grads  # None until the first step decides (setting "where cheap")
        rule = self.tensors.rule()
        if rule is not None:
            header["grads_rule"] = rule
        if self.stop_after is not None:
            header["stopped_after_steps"] = self.stop_after
        if self.grad_scaler:
            header["grad_scaler"] = True
        if self._stopped_at is not None:  # the trace ends there, whatever the script did after
            header["stopped"] = self._stopped_at
        cost = self.sampling.cost()
        if cost is not None:  # (measured by the budget's clock, whatever the budget)
            header["cost"] = cost
        return header


def _params_of(optimizer: Any) -> list[Any]:
    return [p for group in optimizer.param_groups for p in group["params"]]
