"""What a step's trace record reads of the model's tensors: the parameters' names, their
fingerprints and their gradients', and CPU copies for a replay; the tracer decides when.

Gradients are hashed "where cheap" by default (`grads=None`): always on an accelerator (the
checksum rides the same copy back), on CPU when the optimizer's parameters hold at most
GRADS_CHEAP_BYTES. There every gradient hash is one more pass over memory; for a model the size of
the reference MLP it would cost as much as the parameters' own hash.

The same parameters are fingerprinted step after step, so their names and byte views are kept
(`fingerprint.InPlaceHashes`): a step costs one call and one pass over the bytes per tensor.
"""

from __future__ import annotations

from typing import Any

from cascade_repro.child import step_values
from cascade_repro.determinism import fingerprint

GRADS_CHEAP_BYTES = 1 << 20  # CPU: hashing this much costs ~30 µs a step


class StepTensors:
    """The parameters' names (module paths, looked up once) and fingerprints."""

    def __init__(self, torch: Any, grads: bool | None) -> None:
        self.torch = torch
        self.grads_setting = grads  # None: "where cheap", decided from the first step's parameters
        self.grads = grads
        self.named = False  # module paths looked up (once, from the live modules)
        self._names: dict[int, str] = {}
        self._names_key: tuple[int, ...] = ()  # the tensors `_names_list` names, by id
        self._names_list: list[str] = []
        self._param_hashes = fingerprint.InPlaceHashes(torch)
        self._grad_hashes = fingerprint.InPlaceHashes(torch)

    def look_up_names(self) -> list[Any]:
        """The live modules' parameters, sorted by module path (named from now on)."""
        found = step_values.named_parameters(self.torch)
        self._names = {id(p): name for name, p in found}
        self.named = True
        return [p for _, p in found]

    def decide_grads(self, params: list[Any]) -> bool:
        """Decide "where cheap" from the first step's parameters; whether it was decided now."""
        if self.grads is not None:
            return False
        on_cpu = [p for p in params if p.device.type == "cpu"]
        cpu_bytes = sum(p.numel() * p.element_size() for p in on_cpu)
        self.grads = len(on_cpu) < len(params) or cpu_bytes <= GRADS_CHEAP_BYTES
        return True

    def rule(self) -> str | None:
        """The gradients' rule as the trace's header states it, where it is the default."""
        if self.grads_setting is not None:
            return None
        return f"where cheap: on an accelerator, or on CPU up to {GRADS_CHEAP_BYTES} B"

    def name(self, tensor: Any, index: int) -> str:
        return self._names.get(id(tensor)) or f"param{index}"

    def params(self, params: list[Any]) -> dict[str, str]:
        """{name: fingerprint} of the parameters as they are now."""
        return dict(zip(self._names_of(params), self._param_hashes(params), strict=True))

    def gradients(self, params: list[Any]) -> dict[str, str]:
        """{name: fingerprint} of the gradients there are."""
        grads = [p.grad for p in params]
        if None not in grads:
            return dict(zip(self._names_of(params), self._grad_hashes(grads), strict=True))
        with_grad = [(i, p) for i, p in enumerate(params) if p.grad is not None]
        hashes = self._grad_hashes([p.grad for _, p in with_grad])
        return {self.name(p, i): h for (i, p), h in zip(with_grad, hashes, strict=True)}

    def copies(self, params: list[Any], grads: bool = False) -> dict[str, Any]:
        """{name: CPU copy} of the parameters (or their gradients), for a replay to save."""
        tensors = {}
        for index, param in enumerate(params):
            tensor = param.grad if grads else param
            if tensor is not None:
                tensors[self.name(param, index)] = tensor.detach().to("cpu", copy=True)
        return tensors

    def _names_of(self, params: list[Any]) -> list[str]:
        key = tuple(map(id, params))
        if key != self._names_key:
            self._names_key, self._names_list = key, [self.name(p, i) for i, p in enumerate(params)]
        return self._names_list
