"""Where the step trace enters torch: the optimizer's global step hooks, `torch.autograd.backward`,
`DataLoader.__iter__`, the first module forward, and the modules' registrations of their parameters
and submodules (child/module_registry.py). Each calls one of the tracer's entry points;
what the trace reads at each is child/trace.py.

These run between training steps, where every Python call costs a microsecond or more (the step has
flushed the caches): each entry point is one call, and a step that reads nothing returns early.
"""

from __future__ import annotations

import importlib
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
    _wrap_backward(tracer)
    _wrap_dataloader(tracer)
    _start_at_first_forward(tracer)


def _wrap_backward(tracer: StepTracer) -> None:
    autograd = importlib.import_module("torch.autograd")
    original_backward = autograd.backward
    tensor = importlib.import_module("torch").Tensor

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        # Tensor.backward() calls torch.autograd.backward(), so this sees both spellings.
        tracer.backwards += 1  # (a loader that yields twice with none between fetches ahead)
        if isinstance(tensors, tensor) and tensors.numel() == 1:  # a loss: the step's (no copy; read
            step, losses = tracer.last_backward  # when the step ends or, if it has no record, at exit)
            if step != tracer.step:
                tracer.backward_before, tracer.last_backward = tracer.last_backward, (tracer.step, [tensors])
                if tracer.in_step:  # the step's first loss is its closure's
                    tracer.closure_from = (tracer.step, 0)
            elif tracer.in_step:  # the optimizer's closure (evaluated again: its last loss is the step's;
                at, start = tracer.closure_from  # Lightning's last micro-batch runs in it): its
                if at != tracer.step:  # first backward, after the step's own losses
                    start = len(losses)
                    tracer.closure_from = (tracer.step, start)
                losses[start:] = [tensors]
            elif len(losses) < MAX_LOSSES:  # gradient accumulation: each micro-batch's, in order
                losses.append(tensors)
        if tracer.coasting:  # a step without a record: nothing of it is read
            return original_backward(tensors, *args, **kwargs)
        tracer.backward_begins(tensors)
        result = original_backward(tensors, *args, **kwargs)
        tracer.backward_ended()
        return result

    autograd.backward = backward  # type: ignore[attr-defined]


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


def _start_at_first_forward(tracer: StepTracer) -> None:
    """A global forward pre-hook, removed at its first call: modules take the fast path again."""
    module = importlib.import_module("torch.nn.modules.module")
    handles: list[Any] = []

    def first_forward(*_: Any) -> None:
        while handles:
            handles.pop().remove()
        tracer.start()

    handles.append(module.register_module_forward_pre_hook(first_forward))
