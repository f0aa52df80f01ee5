"""The CascadeError tree: every failure a user can act on, with its exit code and the fix.

    CascadeError                 exit 1
    ├── UsageError               exit 2  (bad option, unknown override key, script not found)
    ├── NotAGitRepository        exit 1
    ├── ConfigError              exit 1  (malformed YAML, bad cascade.yaml value)
    ├── StoreError               exit 1  (MLflow store unreachable or refusing)
    ├── RunNotFound              exit 1  (with close matches)
    ├── DirtyTreeRefused         exit 1  (--require-clean on a dirty tree)
    ├── VersionTaken             exit 1  (a version held by another run; --force moves it)
    ├── RestoreRefused           exit 1  (missing commit, tampered record, modified worktree)
    ├── UnsafeRecord             exit 1  (a record whose paths or symlinks lead out of the target)
    ├── DataError                exit 1  (DVC cache/remote: missing, unreachable or corrupt objects)
    ├── DockerError              exit 1  (no engine, base image unavailable, build failed, no GPUs)
    └── RecordIncomplete         exit 4  (the script exited 0 but its record is incomplete or still
                                          pending delivery in .cascade/runs/; see `cascade sync`)

Library code only raises; a result that is not an error carries its own status (`exit_status` on
`RunResult`, `Verdict`, `RestoreResult`, `CheckReport`, `SyncResult`), and `cli` exits with it.
`cascade run` returns 4 without raising (the run is recorded as far as it could be); a script's own
nonzero code wins over 4. The codes, in one place:
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_REPRODUCED = 3  # verify, restore: diverged or incomparable; check: within tolerance only
EXIT_INCOMPLETE = 4  # the record is incomplete or still pending delivery
EXIT_INTERRUPTED = 130


def signal_name(number: int) -> str:
    """SIGTERM for 15; "signal 99" for a number no signal of this system has (a record's)."""
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class CascadeError(Exception):
    """A failure with a message for the user and a hint that names the fix."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"  # one line: a warning


class UsageError(CascadeError):
    """A command used wrongly: a bad option or value, an unknown key, a script not found (exit 2)."""

    exit_code = EXIT_USAGE


class NotAGitRepository(CascadeError):
    """Not inside a git work tree, or one with no commit yet."""

    pass


class ConfigError(CascadeError):
    """cascade.yaml or a params file that cannot be used as it is (malformed, a bad value)."""

    pass


class StoreError(CascadeError):
    """The MLflow store cannot be reached or refused a request."""

    pass


class RunNotFound(CascadeError):
    """No run (or no cascade record) for a ref; the hint names close matches."""

    pass


class DirtyTreeRefused(CascadeError):
    """--require-clean on a working tree with uncommitted changes."""

    pass


class VersionTaken(CascadeError):
    """A version another run holds (--force moves it, recorded)."""

    pass


class RestoreRefused(CascadeError):
    """Restore stopped before re-running: the record cannot be rebuilt faithfully or safely here."""


class UnsafeRecord(CascadeError):
    """A run record (untrusted: it may come from a shared server) would write outside its target."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(
            message, hint or "the run record was altered or made by something else; nothing was written"
        )


class DataError(CascadeError):
    """DVC: an object missing from cache and remote, a corrupt object, an unreachable remote."""


class DockerError(CascadeError):
    """The Docker engine, an image build or a container failed; the message says which and the fix."""


class RecordIncomplete(CascadeError):
    """The store lacks part of a record: pending in the spool (`cascade sync`) or refused (named)."""

    exit_code = EXIT_INCOMPLETE
