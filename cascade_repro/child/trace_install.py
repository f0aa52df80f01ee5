"""Where the step trace enters torch: the optimizer's global step hooks, `torch.autograd.backward`,
`DataLoader.__iter__`, the first module forward, the modules' registrations of their parameters
and submodules (child/module_registry.py), and mixed precision's `GradScaler` (`scale`, `step`). Each
calls one of the tracer's entry points; what the trace reads at each is child/trace.py.

These run between training steps, where every Python call costs a microsecond or more (the step has
flushed the caches): each entry point is one call, and a step that reads nothing returns early.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cascade_repro.child.trace import StepTracer

MAX_LOSSES = 4096  # losses kept for one step (a script that never steps an optimizer: bounded)


def install(tracer: StepTracer) -> None:
    optim = importlib.import_module("torch.optim.optimizer")  # not loaded by `import torch` alone
    before, after = tracer.step_hooks()
    optim.register_optimizer_step_pre_hook(before)
    optim.register_optimizer_step_post_hook(after)
    tracer.tensors.registry.install()
    _count_optimizers(optim.Optimizer, tracer)
    _wrap_backward(tracer)
    _wrap_dataloader(tracer)
    _wrap_grad_scaler(tracer, before, after)
    _start_at_first_forward(tracer)


def _count_optimizers(optimizer: Any, tracer: StepTracer) -> None:
    """Each torch optimizer made: where one exists, weights that change between two backward() calls
    before its first step (SAM's perturbation, under torch.no_grad) are no sign of a manual update."""
    original_init = optimizer.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - replaces Optimizer.__init__
        tracer.optimizers_made += 1
        original_init(self, *args, **kwargs)

    optimizer.__init__ = __init__


def _wrap_backward(tracer: StepTracer) -> None:
    autograd = importlib.import_module("torch.autograd")
    original_backward = autograd.backward
    tensor = importlib.import_module("torch").Tensor
    note_loss = functools.partial(_note_loss, tracer)

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        # Tensor.backward() calls torch.autograd.backward(), so this sees both spellings.
        if tracer.in_step and not tracer.step_takes_args:  # not a closure's: the step under way raised
            tracer.step_never_returned()
        tracer.backwards += 1  # (a loader that yields twice with none between fetches ahead)
        if isinstance(tensors, tensor):
            if tensors.numel() == 1:  # a loss: the step's (no copy; read when the step ends or, if
                note_loss(tensors)  # it has no record, at exit)
        elif isinstance(tensors, (list, tuple)) and all(isinstance(t, tensor) and t.numel() == 1
                                                        for t in tensors):  # fmt: skip
            for index, loss in enumerate(tensors):  # `autograd.backward([loss_a, loss_b])`: the step's
                note_loss(loss, together=index > 0)  # loss is their sum
        if tracer.coasting:  # a step without a record: nothing of it is read
            return original_backward(tensors, *args, **kwargs)
        tracer.backward_begins(tensors)
        result = original_backward(tensors, *args, **kwargs)
        tracer.backward_ended()
        return result

    autograd.backward = backward  # type: ignore[attr-defined]


def _note_loss(tracer: StepTracer, backpropagated: Any, together: bool = False) -> None:
    """One loss backpropagated (a GradScaler's: the script's own, the one it scaled); `together`: with
    the one before, in one backward (in a closure too, it adds to that backward's losses)."""
    scaled = tracer.scaled
    loss = scaled[1] if scaled is not None and scaled[0] is backpropagated else backpropagated
    step, losses = tracer.last_backward
    if step != tracer.step:
        tracer.backward_before, tracer.last_backward = tracer.last_backward, (tracer.step, [loss])
        if tracer.in_step:  # the step's first loss is its closure's
            tracer.closure_from = (tracer.step, 0)
    elif tracer.in_step:  # the optimizer's closure (evaluated again: its last loss is the step's;
        at, start = tracer.closure_from  # Lightning's last micro-batch runs in it): its
        if at != tracer.step:  # first backward, after the step's own losses
            start = len(losses)
            tracer.closure_from = (tracer.step, start)
        if not together:
            losses[start:] = [loss]
        elif len(losses) < MAX_LOSSES:
            losses.append(loss)
    elif len(losses) < MAX_LOSSES:  # gradient accumulation: each micro-batch's, in order
        losses.append(loss)


def _wrap_dataloader(tracer: StepTracer) -> None:
    loader = importlib.import_module("torch.utils.data").DataLoader
    original_iter = loader.__iter__
    read_batch = tracer.read_batch

    def __iter__(self: Any) -> Any:  # noqa: N807 - replaces DataLoader.__iter__
        """Each batch as the training loop gets it. A loader whose second batch is asked for before
        any backward() (Accelerate's DataLoaderShard, under the HF Trainer) fetches one ahead: the
        loop trains on the batch before the one yielded, and on the last one once the loader has
        ended."""
        tracer.start()  # before the sampler draws the epoch's order
        backwards, ahead, previous, source = tracer.backwards, False, None, object()
        for yielded, batch in enumerate(original_iter(self), 1):
            if yielded == 2 and tracer.backwards == backwards:
                ahead = True  # (the first batch, read as it was yielded, is the one handed out now)
            elif not tracer.coasting and not tracer.closed:
                read_batch(previous if ahead else batch, source)
            previous = batch
            yield batch
        if ahead and not tracer.coasting and not tracer.closed:
            read_batch(previous, source)  # the last batch, handed out now

    loader.__iter__ = __iter__


def _wrap_grad_scaler(tracer: StepTracer, before: Any, after: Any) -> None:
    """Mixed precision's loss scaling. The script backpropagates `scaler.scale(loss)`: the step's loss
    is `loss`, the one it computed (the scaled one is multiplied by a scale that changes over the run),
    so `scale` keeps its last (scaled, loss) pair for the backward to recognise, until `scaler.step`.
    `scaler.step(opt)` skips `opt.step()` where the gradients hold an inf or a NaN: the step's hooks
    never run, so it ends here, a step of its own marked skipped (steps keep the script's iterations'
    numbers; its loss is not taken for a micro-batch of the next). A scaler's subclass with its own
    `scale` (FSDP's ShardedGradScaler) is wrapped as it is defined. An optimizer that handles the
    scaling itself (`_step_supports_amp_scaling`: the fused Adam) is always stepped: its hooks run,
    and a step it skips inside is not marked."""
    amp = importlib.import_module("torch.amp.grad_scaler")  # (loaded by `import torch`)
    scaler = amp.GradScaler
    tensor = importlib.import_module("torch").Tensor

    def keeps_source(original: Any) -> Any:
        @functools.wraps(original)
        def scale(self: Any, outputs: Any) -> Any:
            scaled = original(self, outputs)
            if scaled is not outputs and isinstance(outputs, tensor):
                tracer.scaled = (scaled, outputs)
                tracer.grad_scaler = True
            return scaled

        scale.cascade_wrapped = True  # type: ignore[attr-defined]
        return scale

    original_step = scaler.step

    @functools.wraps(original_step)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        counted, tracer.scaled = tracer.step, None  # (the scaled loss is let go: backpropagated by now)
        result = original_step(self, optimizer, *args, **kwargs)
        # (a stopped trace coasts to the end: its skipped steps are counted too)
        if tracer.step == counted and (tracer.coasting or not tracer.closed) and self.is_enabled():
            tracer.skipping = True  # (a step hooked is counted by its post-hook)
            try:
                before(optimizer, (), {})
            finally:
                tracer.skipping = False
            after(optimizer, (), {})
        return result

    def __init_subclass__(cls: Any, **kwargs: Any) -> None:  # noqa: N807 - GradScaler's class hook
        super(scaler, cls).__init_subclass__(**kwargs)
        own = cls.__dict__.get("scale")
        if callable(own) and not getattr(own, "cascade_wrapped", False):
            cls.scale = keeps_source(own)

    scaler.scale = keeps_source(scaler.scale)
    scaler.step = step
    scaler.__init_subclass__ = classmethod(__init_subclass__)


def _start_at_first_forward(tracer: StepTracer) -> None:
    """A global forward pre-hook, removed at its first call: modules take the fast path again.

    A module compiled with `torch.compile` (dynamo's OptimizedModule) warns at every call while any
    global module hook is in ("Using `torch.compile(module)` when there are global hooks"): once the
    script has compiled something, OptimizedModule's first call removes the hook before that check
    (the same moment the hook would have fired), and torch.compile and that call are torch's own
    again once any module's forward has run."""
    module = importlib.import_module("torch.nn.modules.module")
    torch: Any = importlib.import_module("torch")
    handles: list[Any] = []
    undo: list[Any] = []  # puts back what waits for the first forward
    patched: list[type] = []  # dynamo's OptimizedModule, once the script has compiled something

    def first_forward(*_: Any) -> None:
        while handles:
            handles.pop().remove()
        while undo:
            undo.pop()()
        tracer.start()

    handles.append(module.register_module_forward_pre_hook(first_forward))
    original_compile = torch.compile

    @functools.wraps(original_compile)
    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - replaces torch.compile
        compiled = original_compile(*args, **kwargs)
        optimized = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
        if handles and isinstance(optimized, type) and optimized not in patched:
            patched.append(optimized)
            _first_call_first(optimized, first_forward, undo)
        return compiled

    def restore_compile() -> None:
        if torch.compile is compile:
            torch.compile = original_compile

    undo.append(restore_compile)
    torch.compile = compile


def _first_call_first(cls: type, first_forward: Any, undo: list[Any]) -> None:
    """`first_forward` runs at the first call of an instance of `cls`, before its own `__call__`."""
    original = cls.__dict__.get("__call__")
    if original is None:
        return

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 - replaces __call__
        first_forward()  # (puts `original` back)
        return original(self, *args, **kwargs)

    def put_back() -> None:
        if cls.__dict__.get("__call__") is __call__:
            type.__setattr__(cls, "__call__", original)

    type.__setattr__(cls, "__call__", __call__)
    undo.append(put_back)
