"""The seeds the script sets itself: its calls to the seeding functions, recorded beside cascade's seed.

cascade seeds Python's `random`, torch and numpy from the run's seed (`seeding.py`); many scripts
then seed them again (`torch.manual_seed(1337)`, Lightning's `seed_everything(42)`, Hugging Face's
`set_seed`), and from then on their seed is the one in force. Each call is recorded in child.json
(`determinism.script_seeds`, beside `determinism.applied`): the function, the seed, the generators
it set (a framework function's are those its own calls set), the step whose RNG fingerprint is the
first to follow it (null: no step trace), and `drawn_before`, the generators drawn from since
cascade seeded them (cascade's seed decided those draws). Only the process that runs the script
records (DataLoader workers seed themselves too).

A `torch.Generator` the script hands a DataLoader (`generator=`, a sampler's) is seeded by a C method
that cannot be wrapped: its seed (`initial_seed()`) is recorded as a call of `torch.Generator`, for
generator "DataLoader", when an iteration over that loader starts and the seed is not the one every
new generator has (a clock-seeded generator otherwise looks like "the data differs" and nothing more).

Functions are wrapped after cascade's own seeding, when their module is imported: nothing here
imports torch, numpy or a framework. The first MAX_RECORDED calls are kept; later ones are counted.
"""

from __future__ import annotations

import functools
import operator
import os
import random
import threading
from types import ModuleType
from typing import Any, Callable

MAX_RECORDED = 32
WRAPPED = "__cascade_seed_hook__"
# Framework seed functions, hooked by the module that defines them (re-exports then carry the hook).
FRAMEWORKS = {
    "lightning.fabric.utilities.seed": "seed_everything",
    "lightning_fabric.utilities.seed": "seed_everything",
    "pytorch_lightning.utilities.seed": "seed_everything",
    "transformers.trainer_utils": "set_seed",
}


class ScriptSeeds:
    """Wraps the seeding functions and keeps the script's calls in `calls` (a facts section)."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.calls: list[dict[str, Any]] = []
        self.omitted = 0
        self.on_change = on_change  # saves the facts; told about each recorded call
        self.on_omitted: Callable[[int], None] = lambda count: None
        # The step whose RNG fingerprint first follows a seed set now (the tracer's), else None.
        self.step: Callable[[], int | None] = lambda: None
        self._pid = os.getpid()
        self._local = threading.local()
        self._unchanged: dict[str, Callable[[], bool]] = {}  # generator → still as cascade seeded it?
        self._loader_seeds: dict[int, int] = {}  # id of a DataLoader's torch.Generator → seed recorded

    # -- what gets wrapped ------------------------------------------------------------------------
    def hook_random(self) -> None:
        """After cascade's `random.seed`: the module function (the script's `from random import seed`
        comes later, so it gets the wrapper too)."""
        state = random.getstate()
        self._unchanged["python"] = lambda: random.getstate() == state
        random.seed = self._wrap(random.seed, "random.seed", ("python",))

    def hook_numpy(self, numpy: ModuleType) -> None:
        module = numpy.random
        state = _numpy_state(module)
        self._unchanged["numpy"] = lambda: _numpy_state(module) == state
        module.seed = self._wrap(module.seed, "numpy.random.seed", ("numpy",))

    def hook_torch(self, torch: Any) -> None:
        state = torch.get_rng_state()
        self._unchanged["torch"] = lambda: bool(torch.equal(torch.get_rng_state(), state))
        wrapped = self._wrap(torch.manual_seed, "torch.manual_seed", ("torch",))
        torch.manual_seed = wrapped
        if getattr(torch, "random", None) is not None:  # torch.random.manual_seed is the same function
            torch.random.manual_seed = wrapped
        self._hook_loader_generators(torch)

    def _hook_loader_generators(self, torch: Any) -> None:
        loader = torch.utils.data.DataLoader
        original_iter = loader.__iter__
        if getattr(original_iter, WRAPPED, False):
            return
        default_seed = torch.Generator().initial_seed()
        recorder = self

        @functools.wraps(original_iter)
        def __iter__(self: Any) -> Any:  # noqa: N807 - replaces DataLoader.__iter__
            if os.getpid() == recorder._pid:
                try:
                    recorder._note_loader_generators(self, default_seed)
                except Exception:  # recording must never break the script's data loading
                    pass
            return original_iter(self)

        setattr(__iter__, WRAPPED, True)
        loader.__iter__ = __iter__

    def _note_loader_generators(self, loader: Any, default_seed: int) -> None:
        sampler = getattr(loader, "sampler", None)
        batch_sampler = getattr(loader, "batch_sampler", None)
        found = (getattr(loader, "generator", None), getattr(sampler, "generator", None),
                 getattr(getattr(batch_sampler, "sampler", None), "generator", None))  # fmt: skip
        for generator in {id(g): g for g in found if g is not None and hasattr(g, "initial_seed")}.values():
            seed = int(generator.initial_seed())
            if seed == default_seed or self._loader_seeds.get(id(generator)) == seed:
                continue
            self._loader_seeds[id(generator)] = seed
            self._record("torch.Generator", seed, {"generators": {"DataLoader"}, "drawn": set()})

    def hook_framework(self, module: ModuleType, name: str) -> None:
        function = getattr(module, name, None)
        if callable(function):
            setattr(module, name, self._wrap(function, f"{module.__name__}.{name}", ()))

    def import_hooks(self) -> dict[str, Callable[[ModuleType], None]]:
        """For `ImportHooks(after=...)`: each framework's seed function, wrapped once it is defined."""
        return {module: functools.partial(_guarded, self.hook_framework, name=name)
                for module, name in FRAMEWORKS.items()}  # fmt: skip

    # -- the wrapper ------------------------------------------------------------------------------
    def _wrap(
        self, original: Callable[..., Any], name: str, generators: tuple[str, ...]
    ) -> Callable[..., Any]:
        if getattr(original, WRAPPED, False):  # a re-export of a function hooked where it is defined
            return original
        recorder = self

        @functools.wraps(original)
        def seeded(*args: Any, **kwargs: Any) -> Any:
            if os.getpid() != recorder._pid:
                return original(*args, **kwargs)
            stack: list[dict[str, Any]] = recorder._stack()
            drawn = [g for g in generators if g in recorder._unchanged and not recorder._unchanged.pop(g)()]
            frame: dict[str, Any] = {"generators": set(generators), "drawn": set(drawn), "seeds": []}
            stack.append(frame)
            try:
                result = original(*args, **kwargs)
            finally:
                stack.pop()
            value = _seed_value(args, kwargs, result, frame["seeds"])
            try:
                # inside another hooked call (seed_everything → torch.manual_seed): that one is recorded
                if stack:
                    stack[-1]["generators"] |= frame["generators"]
                    stack[-1]["drawn"] |= frame["drawn"]
                    stack[-1]["seeds"].append(value)
                else:
                    recorder._record(name, value, frame)
            except Exception:  # recording must never break the script's seeding
                pass
            return result

        setattr(seeded, WRAPPED, True)
        return seeded

    def _stack(self) -> list[dict[str, Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _record(self, name: str, value: Any, frame: dict[str, Any]) -> None:
        step = self.step()  # also has the tracer read the current step's RNG state again
        if len(self.calls) >= MAX_RECORDED:
            self.omitted += 1
            self.on_omitted(self.omitted)  # saved with the facts at exit, not once a step
            return
        call: dict[str, Any] = {"function": name, "seed": value, "generators": sorted(frame["generators"]),
                                "step": step}  # fmt: skip
        if frame["drawn"]:
            call["drawn_before"] = sorted(frame["drawn"])
        self.calls.append(call)
        self.on_change()


def _guarded(hook: Callable[..., None], module: ModuleType, name: str) -> None:
    try:
        hook(module, name)
    except Exception:  # observing must never break the user's import
        pass


def _seed_value(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, inner: list[Any]) -> Any:
    """The seed as JSON: an int, None (seeded from the OS), or the repr of anything else."""
    value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
    if value is None and isinstance(result, int) and not isinstance(result, bool):
        value = result  # seed_everything(None) draws a seed and returns it
    if value is None and inner and all(v == inner[0] for v in inner):
        value = inner[0]
    if value is not None and not isinstance(value, (int, bool)):
        try:
            value = operator.index(value)  # numpy's integers, a 0-d integer tensor
        except TypeError:
            return repr(value)[:200]
    if isinstance(value, bool):
        return repr(value)
    if value is not None and not -(2**127) <= value < 2**128:
        return str(value)[:200]
    return value


def _numpy_state(module: Any) -> tuple[Any, ...]:
    state = module.get_state()
    return state[1].tobytes(), state[2], state[3], state[4]
