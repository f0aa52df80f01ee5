"""What counts as a secret, and how it is redacted in argv, environment values and URLs.

Standard library only: the child imports it too, to redact what it hands to the parent. Redacting is
idempotent (a redacted value redacts to itself), so a record can be redacted again when it is read.

    --api-key=sk-1 / --token sk-1 / db.password=sk-1  →  --api-key=<redacted> / --token <redacted> / ...
    postgresql://u:pw@h/db, https://h/x?token=t       →  postgresql://u:<redacted>@h/db, ...?token=<redacted>
    DB_PASS, PGPASSWORD, SENTRY_DSN, SLACK_WEBHOOK_URL →  <redacted>

A restore re-runs a redacted argv with the values taken from `CASCADE_SECRET_<NAME>` variables
(`secret_slots` names them, `fill_argv` puts them back); redacted environment variables keep this
machine's values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

MARKER = "<redacted>"
SECRET_VARIABLE_PREFIX = "CASCADE_SECRET_"

# Environment names: broad on purpose, a redacted variable just keeps this machine's value on restore.
_SECRET_ENV = re.compile(
    r"TOKEN|SECRET|PASS|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|_KEY$|^KEY|AUTH|SESSION|COOKIE|WEBHOOK"
    r"|(^|_)DSN($|_)|SIGNATURE|(^|_)PAT($|_)|_PWD$|KEY_PEM",
    re.IGNORECASE,
)
_SECRET_ENV_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCP_", "DATABRICKS_")

# Option and key names (--api-key, db.password, ?access_token=): narrower, since a redacted argument
# must be supplied again to restore the run. The last word names what the value is (`--api-key-file`
# is a path, `--pad-token` a tokenizer's token, `--monkey` and `--keep` nothing secret).
_LAST_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "pass", "password", "passwd", "passphrase", "credential",
     "credentials", "creds", "auth", "dsn", "webhook", "privatekey", "sig", "signature", "bearer"}
)  # fmt: skip
# last words secret only after another (GITHUB_PAT, db_pwd; alone, --pat is a pattern, --pwd a directory),
# and not after these (--exclude-pat a pattern, args.pwd a directory, --public-key-pem no secret)
_QUALIFIED_LAST_WORDS = frozenset({"pat", "pwd"})
_NOT_QUALIFYING = frozenset(
    {"exclude", "include", "file", "files", "glob", "search", "re", "regex", "match", "name", "path",
     "ignore", "filter", "args", "arg", "hydra", "cfg", "config", "env", "os", "start", "work", "working",
     "public"}  # (--old-pwd, --current-pwd: passwords)
)  # fmt: skip
_COMPOUND_ENDINGS = ("apikey", "token", "secret", "password", "passwd", "passphrase", "privatekey", "webhook")
_ANY_WORDS = frozenset({"webhook"})  # --slack-webhook-url: the URL is the secret
_NOT_SECRET_TOKENS = frozenset({"pad", "bos", "eos", "unk", "sep", "cls", "mask", "special", "start", "end"})
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")  # dbPwd, APIKey
_BARE_ASSIGNMENT = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.\-/]*=")  # name=value, hydra's +a.b=v / ++a.b=v
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#]*")  # scheme://authority
_QUERY_VALUE = re.compile(r"(?<=[?&;])([A-Za-z0-9_.\-\[\]]+)=([^&#;\s]*)")


def secret_variable(name: str) -> bool:
    """Whether an environment variable's value is never recorded (DB_PASS, HF_TOKEN, AWS_*, *_DSN)."""
    return bool(_SECRET_ENV.search(name)) or name.upper().startswith(_SECRET_ENV_PREFIXES)


def secret_option(name: str) -> bool:
    """Whether an option or key name holds a secret: --api-key, --hfToken, db.password, SECRET_KEY.
    A camelCase name counts as its lowercase whole (--apiKey as --apikey, --passPhrase as --passphrase)
    and, for the names that are secret only after another word, as its words (--dbPwd as --db-pwd,
    privateKeyPem, --slackWebhookUrl); its words also tell a tokenizer's token (--padToken). `--sortKey`
    and `--byPass` stay plain, as one word each."""
    words = _words(name.lower())
    camel = _words(_CAMEL_BOUNDARY.sub("_", name).lower())
    if not words or words[0] == "no" or camel[0] == "no":  # --no-auth, --noAuth: flags
        return False
    for split in (words, camel):
        if split[-1] == "token" and len(split) > 1 and split[-2] in _NOT_SECRET_TOKENS:
            return False  # --pad-token, --padToken: a tokenizer's token
    if _qualified(words) or _qualified(camel):
        return True
    last = words[-1]
    named = any(w in _ANY_WORDS for w in words + camel)
    return last in _LAST_WORDS or last.endswith(_COMPOUND_ENDINGS) or named


def _words(name: str) -> list[str]:
    return [w for w in _WORD_SPLIT.split(name) if w]


def _qualified(words: list[str]) -> bool:
    """A last word secret only after another (GITHUB_PAT, db_pwd) or a key's PEM text (private_key_pem;
    --cert-pem is a certificate, --pem-file a path)."""
    last = words[-1]
    if last in _QUALIFIED_LAST_WORDS:
        return len(words) > 1 and words[-2] not in _NOT_QUALIFYING
    return last == "pem" and len(words) > 1 and words[-2] == "key" and "public" not in words


def is_redacted(value: Any) -> bool:
    """Whether a recorded value lost (part of) its content to redaction."""
    return isinstance(value, str) and MARKER in value


def redact_text(text: str) -> str:
    """Credentials inside any URL in `text`: the password of user:password@, secret-looking query values."""
    if "://" not in text:
        return text
    text = _URL.sub(_redact_authority, text)
    return _QUERY_VALUE.sub(lambda m: f"{m[1]}={MARKER}" if m[2] and secret_option(m[1]) else m[0], text)


def _redact_authority(match: re.Match[str]) -> str:
    url = match[0]
    scheme, _, authority = url.partition("://")
    if "@" not in authority:
        return url
    userinfo, host = authority.rsplit("@", 1)  # a password may hold an unescaped "@"
    user, colon, password = userinfo.partition(":")
    if not colon or not password:
        return url  # ssh://git@host: a user name alone is not a secret
    return f"{scheme}://{user}:{MARKER}@{host}"


def redact_variable(name: str, value: str) -> str:
    """An environment variable's value as recorded: the marker for a secret-looking name, else the
    value with URL credentials redacted."""
    return MARKER if secret_variable(name) else redact_text(value)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The script's arguments as recorded: values of secret-looking options and name=value arguments,
    and URL credentials anywhere, replaced by the marker (one per value, so a restore can fill it)."""
    out: list[str] = []
    value_next = False
    for arg in argv:
        if value_next and not arg.startswith("-"):
            out.append(MARKER)
            value_next = False
            continue
        value_next = False
        name, eq, value = arg.partition("=")
        if eq and (arg.startswith("-") or _BARE_ASSIGNMENT.match(arg)):
            secret = value and secret_option(name)
            out.append(f"{name}={MARKER if secret else redact_text(value)}")
            continue
        if arg.startswith("-") and len(arg) > 2 and arg != "--":
            value_next = secret_option(arg)
        out.append(redact_text(arg))
    return out


@dataclass(frozen=True)
class SecretSlot:
    """One redacted value in a recorded argv and the variable a restore takes it from."""

    position: int  # index in the script's argv
    option: str  # the option or key it belongs to, or "argument N"
    variable: str  # CASCADE_SECRET_<NAME>

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "option": self.option, "variable": self.variable}


def secret_slots(argv: Sequence[str]) -> list[SecretSlot]:
    """Every marker in a recorded argv, in order, each with its own variable.

    >>> [s.variable for s in secret_slots(["--api-key=<redacted>", "--token", "<redacted>"])]
    ['CASCADE_SECRET_API_KEY', 'CASCADE_SECRET_TOKEN']
    """
    slots: list[SecretSlot] = []
    taken: set[str] = set()
    for position, arg in enumerate(argv):
        if MARKER not in arg:
            continue
        name, eq, _ = arg.partition("=")
        previous = argv[position - 1] if position else ""
        if eq and MARKER not in name and (arg.startswith("-") or _BARE_ASSIGNMENT.match(arg)):
            option = name
        elif previous.startswith("-") and "=" not in previous and previous != "--":
            option = previous
        else:
            option = f"argument {position + 1}"
        stem = SECRET_VARIABLE_PREFIX + (re.sub(r"[^A-Za-z0-9]+", "_", option).strip("_").upper() or "ARG")
        for _ in range(arg.count(MARKER)):
            variable, n = stem, 1
            while variable in taken:
                n += 1
                variable = f"{stem}_{n}"
            taken.add(variable)
            slots.append(SecretSlot(position, option, variable))
    return slots


def fill_argv(argv: Sequence[str], values: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The recorded argv with each marker replaced by its variable's value from `values`; and the
    variables `values` lacks (their markers stay)."""
    out = list(argv)
    missing: list[str] = []
    slots = secret_slots(argv)
    for position in sorted({s.position for s in slots}):
        parts = argv[position].split(MARKER)
        filled = [parts[0]]
        for slot, part in zip([s for s in slots if s.position == position], parts[1:], strict=True):
            value = values.get(slot.variable)
            if value is None:
                missing.append(slot.variable)
            filled += [MARKER if value is None else value, part]
        out[position] = "".join(filled)
    return out, missing
