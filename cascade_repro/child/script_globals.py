"""The params of a script configured by its module's globals (nanoGPT's way: `learning_rate = 6e-4`
at the top, a configurator overriding them from a config file and `--key=value`), for a script that
has no other source (argparse, Hydra, the params file: params.used_params decides).

Where the script collects its configuration in a dict of its own globals (nanoGPT's `config`, made
for its logger), the names in that dict are the configuration (their values as the globals hold
them); otherwise every simple global is. They are read from `__main__` when step 0 begins
(child/trace.py), after the configuration and before the training changes any of them (`iter_num`
is 0 there); for a script that never begins a step, as it ended.

What is read: a name without a leading underscore bound to None, a bool, an int, a float, a str, or
a short list or tuple of those. Not a clock reading taken during the run
(`t0 = time.time()` before the loop: a float, or an int of nanoseconds, between the run's start and
now on the wall clock, `monotonic` or `perf_counter`), which differs every run and configures
nothing. Values as JSON holds them (child/parsed_args.py's rules).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from cascade_repro.child.parsed_args import MAX_ITEMS, MAX_VALUES, safe_value

_SCALARS = (type(None), bool, int, float, str)
_CLOCKS: tuple[tuple[Callable[[], float], float], ...] = tuple(
    (clock, clock()) for clock in (time.time, time.monotonic, time.perf_counter)
)  # each clock as the child began (this module is imported before the script runs)


def simple_globals(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration among a module's globals (see the module's docstring), in their order; where
    the script collected it in a dict of its own globals, the names in that dict alone."""
    now = [(clock(), began) for clock, began in _CLOCKS]
    items = list(namespace.items())
    collected = _collected(items)
    if collected is not None:
        items = [(name, value) for name, value in items if name in collected]
    found: dict[str, Any] = {}
    for name, value in items:
        if len(found) >= MAX_VALUES:
            break
        if not isinstance(name, str) or name.startswith("_") or not _configuration(value, now):
            continue
        found[name] = safe_value(value)
    return found


def _configuration(value: Any, clocks: list[tuple[float, float]]) -> bool:
    kind = type(value)
    if kind in (list, tuple):
        return len(value) <= MAX_ITEMS and all(type(item) in _SCALARS for item in value)
    if kind is float:
        return not any(began <= value <= now for now, began in clocks)
    if kind is int and value > 10**15:  # time.time_ns(), perf_counter_ns()
        return not any(began * 1e9 <= value <= now * 1e9 for now, began in clocks)
    return kind in _SCALARS


def _collected(items: list[tuple[Any, Any]]) -> set[str] | None:
    """The keys of the largest dict among the globals whose keys all name globals (nanoGPT's
    `config = {k: globals()[k] for k in config_keys}`, from the names it had before its
    configurator's loop left `arg`, `key` and `val` among them), if there is one of 2 or more. Their
    values are the globals' (nanoGPT divides `gradient_accumulation_steps` by the ranks after)."""
    namespace = dict(items)
    best: set[str] | None = None
    for name, value in items:
        if type(value) is not dict or len(value) < 2 or len(value) > MAX_VALUES or str(name).startswith("_"):
            continue
        if best is not None and len(value) <= len(best):
            continue
        if all(type(key) is str and key in namespace for key in value):
            best = set(value)
    return best
