"""The modules the script built, seen as they register a parameter or a submodule (torch's global
registration hooks), weakly held: the trace names the optimizer's parameters from them rather than
by scanning every live object (`gc.get_objects()`: 40-200 ms once per run with sklearn, Lightning
or MLflow loaded).

A module that registered nothing since the hooks went in (unpickled with `torch.load`, copied with
`copy.deepcopy`, built before) is not here: the tracer falls back on the scan where these modules do
not name every parameter it needs, or name one twice (child/step_tensors.py).
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

PRUNE_EVERY = 10_000  # registrations between two sweeps of the modules that died


class ModuleRegistry:
    def __init__(self) -> None:
        self.installed = False
        self._seen: dict[int, weakref.ref[Any]] = {}  # id -> the module, in the order first seen
        self._since_prune = 0

    def install(self) -> None:
        """Hook torch's global registrations (torch >= 2.0; without them `modules()` stays empty)."""
        module = importlib.import_module("torch.nn.modules.module")
        names = ("register_module_parameter_registration_hook", "register_module_module_registration_hook")
        hooks = [getattr(module, name, None) for name in names]
        if not all(callable(register) for register in hooks):
            return
        for register in hooks:
            register(self._registered)  # type: ignore[misc]
        self.installed = True

    def _registered(self, module: Any, name: str, value: Any) -> None:
        """`module` registered a parameter or a submodule (what it registered is kept as it is). It
        never fails the script's registration: a module it cannot note is left to the scan."""
        try:
            key = id(module)
            known = self._seen.get(key)
            if known is None or known() is not module:  # (a dead module's id, reused)
                self._seen.pop(key, None)
                self._seen[key] = weakref.ref(module)
                self._since_prune += 1
                if self._since_prune >= PRUNE_EVERY:
                    self._prune()
        except Exception:  # (a module class that refuses weak references)
            pass

    def _prune(self) -> None:
        self._since_prune = 0
        for key, ref in list(self._seen.items()):
            if ref() is None:
                self._seen.pop(key, None)

    def modules(self) -> list[Any]:
        """The live modules seen, in the order they were first seen."""
        return [module for module in (ref() for ref in list(self._seen.values())) if module is not None]
