"""The params of a script configured by its module's globals (nanoGPT's way: `learning_rate = 6e-4`
at the top, a configurator overriding them from a config file and `--key=value`), for a script that
has no other source (argparse, Hydra, the params file: params.used_params decides).

They are read from `__main__` as the training begins, at its first backward() or optimizer step
(child/trace.py), after the configuration and before the training changed any of them; for a script
that never began one (an evaluation, no torch, the trace off), as it ended (bootstrap.py).

- Where the script collects its configuration in a dict of its own globals (nanoGPT's `config`, made
  for its logger), that dict is the configuration, with the values it holds (those the user set:
  nanoGPT divides `gradient_accumulation_steps` by the ranks afterwards). A dict counts as such when
  its keys all name globals and cover at least half of the simple ones (not `model_args`).
- Otherwise every simple global is: a name without a leading underscore bound to None, a bool, an
  int, a float, a one-line str of up to MAX_TEXT characters (not a dataset read into memory), or a
  list or tuple of up to MAX_LIST of those (not a vocabulary; a collected dict's: up to MAX_ITEMS).

Never a clock reading taken during the run (`t0 = time.time()` before the loop, `perf_counter_ns()`),
which differs every run and configures nothing: a float with a fraction, or an int of nanoseconds
that is no whole number of milliseconds, between the child's start and now on the wall clock,
`monotonic` or `perf_counter`. Never an int wider than 64 bits. Values as JSON holds them
(child/parsed_args.py's rules).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from cascade_repro.child.parsed_args import MAX_ITEMS, MAX_VALUES, safe_value

MAX_TEXT = 200
MAX_LIST = 16
_SCALARS = (type(None), bool, int, float, str)
_CLOCKS: tuple[tuple[Callable[[], int], int], ...] = tuple(
    (clock, clock()) for clock in (time.time_ns, time.monotonic_ns, time.perf_counter_ns)
)  # each clock as the child began (bootstrap imports this module before the script runs)


def simple_globals(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration among a module's globals (see the module's docstring), in their order."""
    windows = [(began, clock()) for clock, began in _CLOCKS]
    simple = {name: value for name, value in list(namespace.items())
              if isinstance(name, str) and not name.startswith("_") and _simple(value, windows)}  # fmt: skip
    collected = _collected(namespace, simple)
    if collected is not None:
        return {name: safe_value(value) for name, value in collected.items() if _simple(value, windows, True)}
    return {name: safe_value(value) for name, value in list(simple.items())[:MAX_VALUES]}


def _collected(namespace: Mapping[str, Any], simple: Mapping[str, Any]) -> dict[str, Any] | None:
    """The largest dict among the globals whose keys all name globals and cover half of the simple
    ones or more (nanoGPT's `config = {k: globals()[k] for k in config_keys}`, made before its
    configurator's loop left `arg`, `key` and `val` among them), if there is one."""
    best: dict[str, Any] | None = None
    for name, value in list(namespace.items()):
        if type(value) is not dict or not isinstance(name, str) or name.startswith("_"):
            continue
        if len(value) > MAX_VALUES or 2 * len(value) < len(simple) or len(value) < 2:
            continue
        if (best is None or len(value) > len(best)) and all(type(k) is str and k in namespace for k in value):
            best = value
    return best


def _simple(value: Any, windows: list[tuple[int, int]], collected: bool = False) -> bool:
    """A value that may be configuration (a collected dict's strings and lists as they are)."""
    kind = type(value)
    if kind in (list, tuple):
        return len(value) <= (MAX_ITEMS if collected else MAX_LIST) and all(
            type(item) in _SCALARS and _simple(item, windows, collected) for item in value
        )
    if kind is str:
        return collected or (len(value) <= MAX_TEXT and "\n" not in value)
    if kind is float:
        return value != value or value.is_integer() or not _read_from_a_clock(value * 1e9, windows)
    if kind is int:  # (a round number, a budget of 3e11 tokens, is no clock's reading in nanoseconds)
        return value.bit_length() <= 64 and (value % 1_000_000 == 0 or not _read_from_a_clock(value, windows))
    return kind in _SCALARS


def _read_from_a_clock(ns: float, windows: list[tuple[int, int]]) -> bool:
    return any(began <= ns <= now for began, now in windows)
