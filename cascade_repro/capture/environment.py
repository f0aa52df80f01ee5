"""Environment variables that can change results, from an allow-list of prefixes, secrets redacted."""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from cascade_repro.capture.git import strip_credentials

REDACTED = "<redacted>"
_SECRET = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|_KEY$|^KEY|AUTH|SESSION|COOKIE",
    re.IGNORECASE,
)
_SECRET_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCP_", "DATABRICKS_")


def looks_secret(name: str) -> bool:
    return bool(_SECRET.search(name)) or name.upper().startswith(_SECRET_PREFIXES)


def capture_environment(environ: Mapping[str, str], prefixes: Iterable[str]) -> dict[str, str]:
    allowed = tuple(prefixes)
    return {name: redact(name, environ[name]) for name in sorted(environ) if name.startswith(allowed)}


def environment_read(read: Mapping[str, str | None], prefixes: Iterable[str]) -> dict[str, str | None]:
    """Variables the script read that the allow-list does not already record (None: it was unset)."""
    allowed = tuple(prefixes)
    return {
        name: None if value is None else redact(name, value)
        for name, value in sorted(read.items())
        if not name.startswith(allowed)
    }


def redact(name: str, value: str) -> str:
    # Secret-looking names are recorded (their presence can matter), never their values.
    if looks_secret(name):
        return REDACTED
    return strip_credentials(value) if "://" in value else value
