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
  So are the simple attributes of configuration objects among the globals, as `name.attribute`
  (up to MAX_OBJECTS of them): an instance of a dataclass the script defines (modded-nanogpt's
  `args = Hyperparameters()`, whose values are class attributes), a `SimpleNamespace`, or an
  instance of a class the script defines with a configuration's name (`TrainConfig`, `HParams`), or
  such a class itself where it has no instance (`class CFG:`), but a dataclass itself (its
  attributes are the defaults of instances made elsewhere: HF's `ModelArguments`, filled inside
  `main()`); of classes the script defines on no library's base (not a model, not a dataset).

Never a value made for this run alone, which differs every run and configures nothing (two runs of
the same code would differ in params, and `verify` would take that for the cause of a divergence):
- a clock reading taken during the run (`t0 = time.time()` before the loop, `perf_counter_ns()`): a
  float with a fraction, or an int of nanoseconds that is no whole number of milliseconds, between
  the child's start and now on the wall clock, `monotonic` or `perf_counter`;
- a string that holds one (`f"runs/{datetime.now():%Y%m%d-%H%M%S}"`, `f"exp_{int(time.time())}"`):
  a date of the run's days, local or UTC (year, month and day in any usual order and separators,
  or a two-digit year first or last at the start of a number) or epoch seconds of its time; or that
  holds a uuid (its usual form with dashes: `uuid4().hex` is not told from a checksum), this
  process's id (4 digits or more) or the host's name (MIN_HOST characters or more), each as a
  token of its own. A value that holds today's date on purpose (a data snapshot's) is left out too.
Never an int wider than 64 bits. Values as JSON holds them (child/parsed_args.py's rules).
"""

from __future__ import annotations

import os
import re
import time
import types
from typing import Any, Callable, Mapping

from cascade_repro.child.parsed_args import MAX_ITEMS, MAX_VALUES, safe_value

MAX_TEXT = 200
MAX_LIST = 16
MAX_OBJECTS = 4
# (patterns as text: compiled by `re` at their first use, not at every child's start)
_CONFIGURATION_NAME = (
    r"(?i)(cfg|conf|config|configuration|args|arguments|hparams|hyperparameters|params|parameters|settings"
    r"|options|opts)$"
)
_SCALARS = (type(None), bool, int, float, str)
_CLOCKS: tuple[tuple[Callable[[], int], int], ...] = tuple(
    (clock, clock()) for clock in (time.time_ns, time.monotonic_ns, time.perf_counter_ns)
)  # each clock as the child began (bootstrap imports this module before the script runs)


_UUID = r"(?i)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_BETWEEN_DIGITS = r"(?<=\d)[-_./: T](?=\d)"  # 2026-12-06T19:14 reads 202612061914
MAX_DAYS = 62  # a run's days whose dates are looked for (a longer run: its last ones)
MIN_HOST = 8  # a host's name shorter than this is not looked for (`ubuntu` is a user's too)


class _ThisRun:
    """What only this run has: its clocks' windows, its days, its process id, its host's name."""

    def __init__(self) -> None:
        import datetime  # (here, once a script is read, not at every child's start: ~5 ms with socket)
        import socket

        self.windows = [(began, clock()) for clock, began in _CLOCKS]
        began_s, now_s = (moment // 10**9 for moment in self.windows[0])
        self.seconds = range(began_s, now_s + 1)
        # the run's days, local or in UTC (a day before and after the local ones)
        last = datetime.date.fromtimestamp(now_s) + datetime.timedelta(days=1)
        days = min((last - datetime.date.fromtimestamp(began_s)).days + 1, MAX_DAYS - 1)
        self.dates: set[str] = set()  # as digits, separators gone
        self.short_dates: set[str] = set()  # a two-digit year, as a run of digits begins
        for back in range(days + 1):
            day = last - datetime.timedelta(days=back)
            self.dates.update(day.strftime(form) for form in ("%Y%m%d", "%d%m%Y", "%m%d%Y"))
            self.short_dates.update(day.strftime(form) for form in ("%y%m%d", "%d%m%y"))
        pid = str(os.getpid())  # (pid 152 in a container: `resnet-152` is no pid; a token of its own)
        self.pid = re.compile(rf"(?<![a-z0-9]){pid}(?![a-z0-9])", re.IGNORECASE) if len(pid) >= 4 else None
        host = socket.gethostname().split(".")[0]  # (a short one, `train` or `a100`, may be a value)
        self.host = None if len(host) < MIN_HOST or host.lower() == "localhost" else re.compile(
            rf"(?<![a-z0-9]){re.escape(host)}(?![a-z0-9])", re.IGNORECASE
        )  # fmt: skip

    def made_for_it(self, text: str) -> bool:
        """Whether `text` holds a date or epoch seconds of this run, a uuid, its pid or its host."""
        if self.host is not None and self.host.search(text) is not None:
            return True
        if not any(c.isdigit() for c in text):
            return False
        if self.pid is not None and self.pid.search(text) is not None:
            return True
        for digits in re.findall(r"\d+", re.sub(_BETWEEN_DIGITS, "", text)):
            if digits[:6] in self.short_dates or (len(digits) >= 10 and int(digits[:10]) in self.seconds):
                return True
            if len(digits) >= 8 and any(digits[i : i + 8] in self.dates for i in range(len(digits) - 7)):
                return True
        return re.search(_UUID, text) is not None


def simple_globals(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration among a module's globals (see the module's docstring), in their order."""
    run = _ThisRun()
    simple = {name: value for name, value in list(namespace.items())
              if type(name) is str and not name.startswith("_") and _simple(value, run)}  # fmt: skip
    collected = _collected(namespace, simple)
    if collected is not None:
        return {name: safe_value(value) for name, value in collected.items() if _simple(value, run, True)}
    simple.update(_configuration_objects(namespace, run))
    return {name: safe_value(value) for name, value in list(simple.items())[:MAX_VALUES]}


def made_for_this_run(named: Mapping[str, Any]) -> set[str]:
    """The names of the strings and numbers among `named` made for this run alone (its dates, clock
    readings, pid, host): what `simple_globals` leaves out of the globals."""
    run = _ThisRun()
    # (`collected`: a string long or of many lines is no reason here, only what it holds)
    kinds = (str, int, float)
    return {name for name, value in named.items()
            if any(type(value) is kind for kind in kinds) and not _simple(value, run, True)}  # fmt: skip


def _configuration_objects(namespace: Mapping[str, Any], run: _ThisRun) -> dict[str, Any]:
    """{name.attribute: value} of the configuration objects among the globals (module docstring)."""
    found: dict[str, Any] = {}
    objects = 0
    values = list(namespace.items())
    instantiated = {id(kind) for _, value in values for kind in _classes(value)}  # (its instance instead)
    for name, value in values:
        if type(name) is not str or name.startswith("_") or id(value) in instantiated:
            continue
        attributes = _attributes(value)
        if attributes is None:
            continue
        objects += 1
        if objects > MAX_OBJECTS:
            break
        for attribute, item in list(attributes.items())[: 4 * MAX_VALUES]:
            if type(attribute) is str and not attribute.startswith("_") and _simple(item, run):
                found[f"{name}.{attribute}"] = item
    return found


def _classes(value: Any) -> tuple[type, ...]:
    """An instance's class and its bases (none for a class itself)."""
    try:
        return () if isinstance(value, type) else type(value).__mro__
    except Exception:
        return ()


def _attributes(value: Any) -> dict[str, Any] | None:
    """A configuration object's attributes, its classes' first (None: no configuration object)."""
    if type(value) is types.SimpleNamespace:
        return dict(vars(value))
    try:
        kind = value if isinstance(value, type) else type(value)
        mro = kind.__mro__
        if len(mro) > 2 and mro[-2] is tuple and hasattr(kind, "_fields") \
                and all(c.__module__ == "__main__" for c in mro[:-2]):  # fmt: skip
            return _named_tuple_fields(value, kind)  # (a NamedTuple, a class on a namedtuple())
        if kind.__module__ != "__main__" or any(c.__module__ != "__main__" for c in kind.__mro__[:-1]):
            return None  # (not the script's own, or on a library's base: a model, a dataset)
        if hasattr(kind, "__dataclass_fields__") and kind is value:  # (is_dataclass's test)
            return None  # a dataclass itself: its attributes are the defaults of instances made elsewhere
        dataclass = hasattr(kind, "__dataclass_fields__")
        if not dataclass and not re.search(_CONFIGURATION_NAME, kind.__name__):
            return None
        attributes: dict[str, Any] = {}
        for each in reversed(kind.__mro__[:-1]):
            attributes.update(vars(each))
        if kind is not value:
            attributes.update(getattr(value, "__dict__", {}))
            attributes.update(_slots(value, kind))
        return attributes
    except Exception:  # (an object whose class lies about itself)
        return None


def _named_tuple_fields(value: Any, kind: type) -> dict[str, Any] | None:
    """A named tuple's fields: an instance's values, or a configuration-named class's defaults."""
    if kind is not value:
        return dict(zip(kind._fields, value, strict=False))  # type: ignore[attr-defined]
    if not re.search(_CONFIGURATION_NAME, kind.__name__):
        return None
    return dict(kind._field_defaults)


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


def _simple(value: Any, run: _ThisRun, collected: bool = False) -> bool:
    """A value that may be configuration (a collected dict's strings and lists as they are, but for
    what is made for this run alone)."""
    kind = type(value)  # (compared by identity: a metaclass's __eq__ is the script's code)
    if kind is list or kind is tuple:
        return len(value) <= (MAX_ITEMS if collected else MAX_LIST) and all(
            _scalar(type(item)) and _simple(item, run, collected) for item in value
        )
    if kind is str:
        if not collected and (len(value) > MAX_TEXT or "\n" in value):
            return False
        return len(value) > 10 * MAX_TEXT or not run.made_for_it(value)  # (a long text: not searched)
    if kind is float:
        return value != value or value.is_integer() or not _read_from_a_clock(value * 1e9, run.windows)
    if kind is int:  # (a round number, a budget of 3e11 tokens, is no clock's reading in nanoseconds)
        return value.bit_length() <= 64 and (
            value % 1_000_000 == 0 or not _read_from_a_clock(value, run.windows)
        )  # fmt: skip
    return _scalar(kind)


def _scalar(kind: type) -> bool:
    return any(kind is scalar for scalar in _SCALARS)


def _slots(value: Any, kind: type) -> dict[str, Any]:
    """The values in an instance's slots (`@dataclass(slots=True)`), read from their descriptors."""
    found = {}
    for each in kind.__mro__[:-1]:
        for name, descriptor in vars(each).items():
            if type(descriptor) is types.MemberDescriptorType:
                try:
                    found[name] = descriptor.__get__(value, kind)
                except AttributeError:  # (an empty slot)
                    continue
    return found


def _read_from_a_clock(ns: float, windows: list[tuple[int, int]]) -> bool:
    return any(began <= ns <= now for began, now in windows)
