"""The run record's JSON shape, checked whole before any reader uses it.

A record may come from a shared server: a section of the wrong type, a path that is not a string, a
hash that is not hex, a list longer than cascade ever writes, is named in a clear error, never met
as a traceback halfway through a command.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, NoReturn

from cascade_repro import run_target
from cascade_repro.child.protocol import DETERMINISM_MODES
from cascade_repro.distributed import check_section as check_distributed
from cascade_repro.errors import CascadeError

# The record's shape, checked whole before any reader uses it (a record may come from a shared
# server): a section of the wrong type is named, never a traceback halfway through a command.
_SECTIONS: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "experiment": (str,), "command": (dict,), "params": (dict,), "determinism": (dict,),
    "git": (dict,), "python": (dict,), "torch": (dict,), "hardware": (dict,), "environment": (dict,),
    "container": (dict,), "environment_read": (dict,), "data": (list,), "checkpoints": (list,),
    "trace": (dict, type(None)), "metrics": (dict,), "outcome": (dict, type(None)),
    "inputs": (list,), "outputs": (list,), "distributed": (dict, type(None)),
}  # fmt: skip
_ENTRY_LISTS = ("data", "checkpoints", "git.untracked", "inputs", "outputs")  # objects with a string path
MAX_FILE_ENTRIES = 10_000  # inputs, outputs: a record naming more was not made by cascade
# Levels of JSON objects and lists, the record itself the first. cascade's own sections go 5 deep; a
# params file's nesting adds its own: 64 leaves it ~60 levels. Readers (`show --json`'s asdict, the
# comparator, rich) recurse once or more per level, and Python's stack ends near 1,000 frames.
MAX_DEPTH = 64
_COMMIT_LENGTHS = (40, 64)  # a SHA-1 repository's commit ids, a SHA-256 one's


Refuse = Callable[[str, Any, str], NoReturn]


def malformed(run_id: str | None, detail: str) -> CascadeError:
    """The one error for a record cascade cannot use as it is: `detail` names the field and why."""
    return CascadeError(
        f"{'run ' + run_id + ': ' if run_id else ''}the run record is malformed: {detail}",
        hint="the record was altered or made by something else; nothing was done with it",
    )


def check_shape(data: Mapping[str, Any], run_id: str | None = None) -> None:
    """Refuse a record whose sections or the fields commands act on have the wrong JSON types."""

    def refuse(where: str, value: Any, expected: str) -> NoReturn:
        # a container by its size: its text may be megabytes
        shown = f"of {len(value)} entries" if isinstance(value, (dict, list)) else repr(str(value)[:40])
        raise malformed(run_id, f"{where} is {type(value).__name__} {shown}, expected {expected}")

    too_deep = nested_too_deep(data)
    if too_deep is not None:  # first: every check after this one, and every reader, may recurse
        raise malformed(run_id, f"{too_deep} is nested more than {MAX_DEPTH} levels")
    for name, types in _SECTIONS.items():
        if name in data and not isinstance(data[name], types):
            refuse(name, data[name], " or ".join("null" if t is type(None) else t.__name__ for t in types))
    if run_id is not None and data.get("run_id", run_id) != run_id:  # read as this run's: it must be it
        refuse("run_id", data.get("run_id"), f"this run's own id {run_id}")
    _check_command(data, refuse)
    _check_rerun_fields(data, refuse)
    _check_readers_fields(data, refuse)
    _check_script_seeds(data.get("determinism") or {}, refuse)
    check_distributed(data.get("distributed"), refuse)
    _check_entries(data, refuse)
    _check_hashes(data, refuse)
    _check_environment(data, refuse)
    _check_packages(data.get("python") or {}, refuse)


def nested_too_deep(data: Any) -> str | None:
    """Where `data` nests objects or lists more than MAX_DEPTH levels (its first keys), else None.
    Walked with a stack of its own, never by recursion (that is what a deep record would break)."""
    pending: list[tuple[Any, int, str]] = [(data, 1, "")]
    while pending:
        value, depth, where = pending.pop()
        if depth > MAX_DEPTH:
            return where or "the record"
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, item in items:
            if isinstance(item, (dict, list)):
                named = where if where.count(".") >= 1 else f"{where}.{key}".lstrip(".")
                pending.append((item, depth + 1, named[:80]))
    return None


def _check_command(data: Mapping[str, Any], refuse: Refuse) -> None:
    """command.argv and script, git.commit, params.file and params.seed."""
    command, git, params = data.get("command") or {}, data.get("git") or {}, data.get("params") or {}
    argv = command.get("argv", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) and "\0" not in a for a in argv):
        refuse("command.argv", argv, "a list of strings without NUL characters")
    script = command.get("script")
    if command and (not isinstance(script, str) or script[:1] in ("", "-") or "\0" in script):
        refuse("command.script", script, "the path of the script that ran (a string, not an option)")
    module = command.get("module")
    if module is not None and not run_target.is_module_name(module):
        refuse("command.module", module, "the dotted name of the module that ran (`-m NAME`)")
    commit = git.get("commit")
    if commit is not None and not any(_hex(commit, length) for length in _COMMIT_LENGTHS):
        refuse("git.commit", commit, "a commit id: 40 or 64 lowercase hex digits")
    file = params.get("file")
    if file is not None and not (isinstance(file, dict) and isinstance(file.get("values", {}), dict)):
        refuse("params.file", file, "null or an object whose values are an object")
    seed = params.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        refuse("params.seed", seed, "an integer from 0 to 2**64-1")


def _check_readers_fields(data: Mapping[str, Any], refuse: Refuse) -> None:
    """The fields show, diff and verify read as given: metrics' summary, git remotes, params' values,
    the trace's artifact, what the record says it lacks."""
    keys = (data.get("metrics") or {}).get("keys", {})
    if not isinstance(keys, dict):
        refuse("metrics.keys", keys, "an object")
    for name, stats in keys.items():
        fields = ("last", "min", "max", "count")
        if not isinstance(stats, dict) or not _number(stats.get("last")) or \
                not all(_number(stats[f]) for f in fields if f in stats):  # fmt: skip
            refuse(f"metrics.keys.{str(name)[:40]}", stats, "an object of numbers: last (min, max, count)")
    remotes = (data.get("git") or {}).get("remotes", {})
    if not isinstance(remotes, dict):
        refuse("git.remotes", remotes, "an object")
    values = (data.get("params") or {}).get("values", {})
    if not isinstance(values, dict):
        refuse("params.values", values, "an object")
    artifact = (data.get("trace") or {}).get("artifact")
    if artifact is not None and not isinstance(artifact, str):
        refuse("trace.artifact", artifact, "a string")
    missing = (data.get("outcome") or {}).get("missing")
    if missing is None:  # (null: nothing missing)
        return
    if not isinstance(missing, list) or not all(isinstance(line, str) for line in missing):
        refuse("outcome.missing", missing, "a list of strings")


def _check_rerun_fields(data: Mapping[str, Any], refuse: Refuse) -> None:
    """What a re-run is started with: the determinism mode and the trace interval."""
    mode = (data.get("determinism") or {}).get("mode")
    if mode is not None and mode not in DETERMINISM_MODES:
        refuse("determinism.mode", mode, " or ".join(DETERMINISM_MODES))
    interval = (data.get("trace") or {}).get("interval")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 0):
        refuse("trace.interval", interval, "0 (no trace) or a positive number of steps")


def _check_environment(data: Mapping[str, Any], refuse: Refuse) -> None:
    """Variables a re-run sets: names a process environment can hold, string values without NUL."""
    for section in ("environment", "environment_read"):
        for name, value in (data.get(section) or {}).items():
            if not name or "=" in name or "\0" in name:
                refuse(f"{section} variable name", name, "a name without '=' or NUL characters")
            if not isinstance(value, (str, type(None))) or (isinstance(value, str) and "\0" in value):
                refuse(f"{section}.{name[:40]}", value, "a string without NUL characters, or null")


# A distribution's name as capture records it (normalized, PEP 503), and a version: what `check`
# prints as `pip install NAME==VERSION`, so one word without spaces or control characters, never an
# option. Capture recorded pip's leftovers (`~orch`: uninstalling) before it skipped them, and records
# an egg-info's empty version as it is: neither is installed or printed (`installable`).
_PACKAGE_NAME = re.compile(r"~?[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")
_VERSION = re.compile(r"([A-Za-z0-9][!-~]{0,199})?")


def _check_packages(python: Mapping[str, Any], refuse: Refuse) -> None:
    """python.packages: distribution name → {version, origin...} (or a version, as older records)."""
    packages = python.get("packages", {})
    if not isinstance(packages, dict):
        refuse("python.packages", packages, "an object of distribution name → {version}")
    for name, info in packages.items():
        if not _PACKAGE_NAME.fullmatch(name):
            refuse("python.packages name", name, "a distribution name")
        version = info.get("version") if isinstance(info, dict) else info
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            refuse(f"python.packages.{name}", info, "an object with a version (one word, no spaces)")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_entries(data: Mapping[str, Any], refuse: Refuse) -> None:
    """The lists of files (data, checkpoints, untracked, inputs, outputs): objects with a string path,
    bounded in number where the script decides how many."""
    for where in _ENTRY_LISTS:
        section, _, key = where.partition(".")
        entries = (data.get(section) or {}).get(key) if key else data.get(section)
        entries = entries if entries is not None else []
        if not isinstance(entries, list):
            refuse(where, entries, "a list")
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                refuse(f"{where}[{index}]", entry, "an object with a string path")
            link = entry.get("symlink_target")
            if link is not None and not isinstance(link, str):
                refuse(f"{where}[{index}].symlink_target", link, "a string")
    for where in ("inputs", "outputs"):
        entries = data.get(where) or []
        if len(entries) > MAX_FILE_ENTRIES:
            refuse(where, entries, f"a list of at most {MAX_FILE_ENTRIES} entries")
        for index, entry in enumerate(entries):
            size = entry.get("size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                refuse(f"{where}[{index}].size", size, "a non-negative integer")


def _check_hashes(data: Mapping[str, Any], refuse: Refuse) -> None:
    """Hashes that name cache paths or are compared: hex digits of the right length only."""
    for index, entry in enumerate(data.get("checkpoints") or []):
        md5, files = entry.get("md5"), entry.get("files")
        if md5 is not None and not _hex(str(md5).removesuffix(".dir"), 32):
            refuse(f"checkpoints[{index}].md5", md5, "32 hex digits (a directory's: then .dir)")
        if files is not None and (isinstance(files, bool) or not isinstance(files, int) or files < 0):
            refuse(f"checkpoints[{index}].files", files, "a non-negative integer")
    for index, entry in enumerate(data.get("inputs") or []):
        for key, length in (("sha256", 64), ("md5", 32), ("written_by", 32)):  # (written_by: a run id)
            value = entry.get(key)
            if (key == "sha256" or value is not None) and not _hex(value, length):
                refuse(f"inputs[{index}].{key}", value, f"{length} hex digits")


MAX_SCRIPT_SEEDS = 64  # the child keeps 32 calls and counts the rest


def _check_script_seeds(determinism: Mapping[str, Any], refuse: Refuse) -> None:
    """determinism.script_seeds: the seeding calls the script made (child/script_seeds.py), bounded."""
    calls = determinism.get("script_seeds", [])
    if not isinstance(calls, list) or len(calls) > MAX_SCRIPT_SEEDS:
        refuse("determinism.script_seeds", calls, f"a list of at most {MAX_SCRIPT_SEEDS} calls")
    for index, call in enumerate(calls):
        where = f"determinism.script_seeds[{index}]"
        if not isinstance(call, dict):
            refuse(where, call, "an object")
        function, seed, step = call.get("function"), call.get("seed"), call.get("step")
        if not isinstance(function, str) or len(function) > 200:
            refuse(f"{where}.function", function, "a name of at most 200 characters")
        if isinstance(seed, bool) or not (
            seed is None or (isinstance(seed, int) and -(2**127) <= seed < 2**128)
            or (isinstance(seed, str) and len(seed) <= 200)
        ):  # fmt: skip
            refuse(f"{where}.seed", seed, "null, an integer below 2**128 or a string of at most 200 chars")
        for key in ("generators", "drawn_before"):
            names = call.get(key, [])
            if (
                not isinstance(names, list)
                or len(names) > 8
                or not all(isinstance(n, str) and len(n) <= 40 for n in names)
            ):
                refuse(f"{where}.{key}", names, "a list of at most 8 generator names")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            refuse(f"{where}.step", step, "null or a non-negative integer")
    omitted = determinism.get("script_seeds_omitted", 0)
    if isinstance(omitted, bool) or not isinstance(omitted, int) or omitted < 0:
        refuse("determinism.script_seeds_omitted", omitted, "a non-negative integer")


def _hex(value: Any, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and all(c in "0123456789abcdef" for c in value)
