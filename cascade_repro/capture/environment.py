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
    captured: dict[str, str] = {}
    for name in sorted(environ):
        if not name.startswith(allowed):
            continue
        if looks_secret(name):
            # Secret-looking names are recorded (their presence can matter), never their values.
            captured[name] = REDACTED
        elif "://" in environ[name]:
            captured[name] = strip_credentials(environ[name])
        else:
            captured[name] = environ[name]
    return captured
