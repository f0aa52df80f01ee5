"""Which environment variables the script reads (names, and at exit their values), so restore can set
them again and a verdict can name one that differs. Standard library only."""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Iterator

# cascade's own, or specific to a machine or a login:
# restoring them would break the re-run, comparing them would only add noise.
NOT_RECORDED_PREFIXES = (
    "CASCADE_", "MLFLOW_", "PYTHON", "LC_", "SSH_", "XDG_", "GIT_", "CONDA", "VIRTUAL_ENV", "DBUS_",
)  # fmt: skip
MACHINE_SPECIFIC = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "TERM", "LANG", "LANGUAGE",
        "TMPDIR", "TEMP", "TMP", "DISPLAY", "HOSTNAME", "COLUMNS", "LINES", "TZ", "LD_LIBRARY_PATH",
        "SHLVL", "MAIL", "EDITOR", "PAGER", "NO_COLOR", "FORCE_COLOR", "CLICOLOR", "COLORTERM",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "ALL_PROXY",
        "all_proxy", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE", "_", "PS1",
        "USERNAME", "LNAME", "CI",
    }
)  # fmt: skip


def record_reads() -> set[str]:
    """From now on, every `os.environ[...]`, `.get`, `in` and `os.getenv` adds the name to the set."""
    names: set[str] = set()
    # Keys handed out by iteration and not yet looked up. `dict(os.environ)`, `.copy()` and
    # `.items()` look every key up in iteration order right after (or while) iterating: those
    # lookups are a copy, not reads. Any other lookup is a read, and ends the copy.
    iterated: deque[str] = deque()
    base: Any = type(os.environ)

    class RecordingEnviron(base):
        def __getitem__(self, key: str) -> str:
            if iterated and iterated[0] == key:
                iterated.popleft()
            else:
                iterated.clear()
                # os.get_exec_path() (any subprocess of a bare program name) tries
                # os.environ[b"PATH"], which always fails: bytes keys live in os.environb.
                if isinstance(key, str):
                    names.add(key)
            return str(base.__getitem__(self, key))

        def __iter__(self) -> Iterator[str]:
            for key in base.__iter__(self):
                iterated.append(key)
                yield key

    os.environ.__class__ = RecordingEnviron
    return names


def values_read(names: set[str]) -> dict[str, str | None]:
    """Name → value at exit (None: unset), minus machine-specific names, secrets redacted here: the
    hand-off file outlives the child when the parent dies, so it never holds a secret."""
    from cascade_repro.redaction import redact_variable  # at exit only: the script's start stays light

    data = os.environ._data  # type: ignore[attr-defined]  # raw, without recording these lookups
    decode = os.environ.decodevalue
    encode = os.environ.encodekey
    out: dict[str, str | None] = {}
    for name in sorted(n for n in names if isinstance(n, str)):
        if name in MACHINE_SPECIFIC or name.startswith(NOT_RECORDED_PREFIXES):
            continue
        raw = data.get(encode(name))
        out[name] = None if raw is None else redact_variable(name, decode(raw))
    return out
