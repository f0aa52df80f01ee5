"""Environment variables that can change results, from an allow-list of prefixes, secrets redacted."""

from __future__ import annotations

from typing import Iterable, Mapping

from cascade_repro.redaction import redact_variable


def capture_environment(environ: Mapping[str, str], prefixes: Iterable[str]) -> dict[str, str]:
    allowed = tuple(prefixes)
    return {
        name: redact_variable(name, environ[name]) for name in sorted(environ) if name.startswith(allowed)
    }


def environment_read(read: Mapping[str, str | None], prefixes: Iterable[str]) -> dict[str, str | None]:
    """Variables the script read that the allow-list does not already record (None: it was unset).
    The child redacted them already; redacting again costs nothing and covers older children."""
    allowed = tuple(prefixes)
    return {
        name: None if value is None else redact_variable(name, value)
        for name, value in sorted(read.items())
        if not name.startswith(allowed)
    }
