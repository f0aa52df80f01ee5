"""What a step's trace record reads of the model's tensors: the parameters' names, their
fingerprints and their gradients', and CPU copies for a replay; the tracer decides when.

Gradients are hashed "where cheap" by default (`grads=None`): always on an accelerator (the
checksum rides the same copy back), on CPU when the optimizer's parameters hold at most
GRADS_CHEAP_BYTES. There every gradient hash is one more pass over memory; for a model the size of
the reference MLP it would cost as much as the parameters' own hash.

The same parameters are fingerprinted step after step, so their names and byte views are kept
(`fingerprint.InPlaceHashes`): a step costs one call and one pass over the bytes per tensor.

With `defer` (the tracer's choice where it reads them every step), fingerprints of tensors on an
accelerator are left on the device (`Deferred`) and read when the trace is written (`settle`):
copying them back at once would make the host wait for the device at every step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from cascade_repro.child import step_values
from cascade_repro.child.module_registry import ModuleRegistry
from cascade_repro.determinism import fingerprint

GRADS_CHEAP_BYTES = 1 << 20  # CPU: hashing this much costs ~30 µs a step
FACETS = ("params_before", "grads", "params_after")  # a record's {name: fingerprint} facets


class Deferred(NamedTuple):
    """{name: fingerprint} whose device checksums are still on the device."""

    names: list[str]
    later: fingerprint.Later


def settle(torch: Any, records: list[dict[str, Any]]) -> None:
    """Replace the records' `Deferred` facets by {name: fingerprint} and their pending batches by
    their fingerprints: one copy back per device for all of them."""
    found = [(record, facet) for record in records for facet in FACETS
             if isinstance(record.get(facet), Deferred)]  # fmt: skip
    batches = [record for record in records if isinstance(record.get("batch"), fingerprint.Later)]
    if not found and not batches:
        return
    # a batch may stand in several steps' records (no new batch between two steps): read once
    unique = list({id(record["batch"]): record["batch"] for record in batches}.values())
    values = fingerprint.settle(torch, [record[facet].later for record, facet in found] + unique)
    for (record, facet), hashes in zip(found, values[: len(found)], strict=True):
        record[facet] = dict(zip(record[facet].names, hashes, strict=True))
    joined = {id(b): step_values.joined(h) for b, h in zip(unique, values[len(found) :], strict=True)}
    for record in batches:
        record["batch"] = joined[id(record["batch"])]


class StepTensors:
    """The parameters' names (module paths, looked up once) and fingerprints."""

    def __init__(self, torch: Any, grads: bool | None, defer: bool = False) -> None:
        self.torch = torch
        self.defer = defer  # device fingerprints left on the device until the trace is written
        self.grads_setting = grads  # None: "where cheap", decided from the first step's parameters
        self.grads = grads
        self.named = False  # module paths looked up (once, from the live modules)
        self.scanned = False  # ... by a scan of every live module
        self.registry = ModuleRegistry()  # the modules the script built (installed with the trace)
        self._names: dict[int, str] = {}
        self._names_key: tuple[int, ...] = ()  # the tensors `_names_list` names, by id
        self._names_list: list[str] = []
        self._param_hashes = fingerprint.InPlaceHashes(torch)
        self._grad_hashes = fingerprint.InPlaceHashes(torch)

    def look_up_names(self, scan: bool = False) -> list[Any]:
        """The live modules' parameters, sorted by module path (named from now on): of the modules
        the script built (`registry`) where they hold any and no parameter under two of them, else
        (or with `scan`) of every live module. `names_cover` says if they name what a step reads."""
        found: list[tuple[str, Any]] = []
        if not scan and self.registry.installed:
            found, shared = step_values.roots_parameters(self.registry.modules())
            if shared:
                found = []
        self.scanned = not found
        if not found:
            found = step_values.named_parameters(self.torch)
        self._names = {id(p): name for name, p in found}
        self._names_key = ()  # (the names `_names_of` kept are read again)
        self.named = True
        return [p for _, p in found]

    def names_cover(self, params: list[Any]) -> bool:
        """Whether every one of `params` is named by the lookup (a scan names all there are)."""
        return self.scanned or all(id(p) in self._names for p in params)

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

    def params(self, params: list[Any], now: bool = False) -> dict[str, str] | Deferred:
        """{name: fingerprint} of the parameters as they are now (`Deferred` where `defer` leaves
        some on a device, unless `now`)."""
        return self._named(self._names_of(params), self._param_hashes, params, now)

    def gradients(self, params: list[Any]) -> dict[str, str] | Deferred:
        """{name: fingerprint} of the gradients there are."""
        grads = [p.grad for p in params]
        if None not in grads:
            return self._named(self._names_of(params), self._grad_hashes, grads)
        every = self._names_of(params)
        with_grad = [i for i, g in enumerate(grads) if g is not None]
        return self._named([every[i] for i in with_grad], self._grad_hashes, [grads[i] for i in with_grad])

    def _named(self, names: list[str], hashes: fingerprint.InPlaceHashes, tensors: list[Any],
               now: bool = False) -> dict[str, str] | Deferred:  # fmt: skip
        if not self.defer or now:
            return dict(zip(names, hashes(tensors), strict=True))
        taken = hashes.later(tensors)
        if isinstance(taken, fingerprint.Later):
            return Deferred(names, taken)
        return dict(zip(names, taken, strict=True))

    def wait_for_devices(self) -> None:
        """The accelerators the fingerprints were read on finish what was queued on them so far."""
        self._param_hashes.wait()
        self._grad_hashes.wait()

    def copies(self, params: list[Any], grads: bool = False) -> dict[str, Any]:
        """{name: CPU copy} of the parameters (or their gradients), for a replay to save."""
        tensors = {}
        for name, param in zip(self._names_of(params), params, strict=True):
            tensor = param.grad if grads else param
            if tensor is not None:
                tensors[name] = tensor.detach().to("cpu", copy=True)
        return tensors

    def _names_of(self, params: list[Any]) -> list[str]:
        """A name for each of `params`, each name once: a path that two roots share (a backbone and a
        head, both `Sequential`, in one optimizer: "0.weight" twice) gets `@` and the parameter's
        place in the list after its second and later uses, so no tensor's fingerprint hides another."""
        key = tuple(map(id, params))
        if key != self._names_key:
            names = [self.name(p, i) for i, p in enumerate(params)]
            if len(set(names)) < len(names):
                seen: set[str] = set()
                for index, name in enumerate(names):
                    if name in seen:
                        names[index] = f"{name}@{index}"
                    seen.add(name)
            self._names_key, self._names_list = key, names
        return self._names_list
