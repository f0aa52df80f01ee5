"""git, where the code is kept: every git command cascade runs goes through this module.

Above it nothing starts `git` itself (tests/unit/test_adapters.py reads the sources for it): callers
get plain values, a `CompletedProcess` they inspect, or a `CascadeError` that names the command.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cascade_repro.errors import CascadeError, NotAGitRepository

# A tag or commit made by cascade in a repository with no identity configured (a fresh CI box).
FALLBACK_IDENTITY = ("-c", "user.name=cascade", "-c", "user.email=cascade@localhost")


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`git ARGS` in `cwd`, its output as bytes, never raising on git's own failure (the caller reads
    the return code); a machine without git is a CascadeError that says to install it."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    except FileNotFoundError:
        raise CascadeError("git is not installed", hint="install git (e.g. apt-get install git)") from None


def output(cwd: Path, *args: str) -> bytes:
    """stdout of `git ARGS`; a failure is a CascadeError with git's own message."""
    out = run(cwd, *args)
    if out.returncode != 0:
        raise CascadeError(f"git {' '.join(args)} failed: {stderr(out)}")
    return out.stdout


def text(cwd: Path, *args: str) -> str:
    """stdout of `git ARGS` as text (paths git prints undecodable keep their bytes as surrogates)."""
    return output(cwd, *args).decode("utf-8", "surrogateescape")


def succeeds(cwd: Path, *args: str) -> bool:
    return run(cwd, *args).returncode == 0


def stderr(out: subprocess.CompletedProcess[bytes]) -> str:
    return out.stderr.decode(errors="replace").strip()


def names(listing: bytes) -> list[str]:
    """The entries of a `-z` listing (ls-files, status), as paths."""
    return [name for name in listing.decode("utf-8", "surrogateescape").split("\0") if name]


def toplevel(start: Path) -> Path:
    """The top of the work tree containing `start`."""
    out = run(start, "rev-parse", "--show-toplevel")
    if out.returncode != 0:
        raise NotAGitRepository(
            f"{start} is not inside a git repository",
            hint="cd into your project, or run `git init && git add -A && git commit -m init` first",
        )
    return Path(out.stdout.decode().strip()).resolve()


def head_commit(root: Path) -> str:
    """HEAD's commit; a repository with no commit yet cannot be recorded."""
    out = run(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    if out.returncode != 0:
        raise NotAGitRepository(
            f"the git repository at {root} has no commit yet",
            hint="commit your code first: git add -A && git commit -m 'initial'",
        )
    return out.stdout.decode().strip()


def is_commit_id(value: object) -> bool:
    """A full commit id (SHA-1 or SHA-256, lowercase hex): what a record's commit must be before it
    reaches git, where anything else may read as an option (`--output=FILE`) or a revision range."""
    return (isinstance(value, str) and len(value) in (40, 64)
            and all(c in "0123456789abcdef" for c in value))  # fmt: skip


def has_commit(root: Path, commit: str) -> bool:
    """Whether `commit` is in the repository at `root` (a record may name one never fetched here)."""
    return is_commit_id(commit) and succeeds(root, "cat-file", "-e", f"{commit}^{{commit}}")


def as_committer(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`git ARGS` that writes an object (a tag), with cascade as the identity where none is set."""
    out = run(root, *args)
    said = (out.stderr + out.stdout).decode(errors="replace").lower()
    if out.returncode != 0 and "tell me who you are" in said:
        out = run(root, *FALLBACK_IDENTITY, *args)
    return out


def tracked(root: Path, paths: list[str], batch: int = 500) -> set[str]:
    """Which of `paths` (relative to `root`) git tracks, taken literally (no globbing)."""
    found: set[str] = set()
    for start in range(0, len(paths), batch):
        specs = [f":(literal){p}" for p in paths[start : start + batch]]
        out = run(root, "ls-files", "-z", "--cached", "--", *specs)
        if out.returncode == 0:
            found.update(names(out.stdout))
    return found


def visible_files(root: Path, *pathspecs: str) -> list[str]:
    """Files git sees in the work tree: tracked and untracked, not ignored."""
    spec = ("--", *pathspecs) if pathspecs else ()
    return names(output(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", *spec))


def ignored_files(root: Path, *pathspecs: str) -> list[str]:
    """Files in the work tree that git ignores (each file, not only their directories)."""
    spec = ("--", *pathspecs) if pathspecs else ()
    return names(output(root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", *spec))


def git_dir(work_tree: Path) -> Path:
    """The git directory of a work tree (a linked worktree has its own under the main one's)."""
    return Path(text(work_tree, "rev-parse", "--absolute-git-dir").strip())


def remote_url(root: Path, remote: str) -> str | None:
    """The URL of `remote` (None without one). Read from the repository's own config file where it
    is plainly there (every command's settings ask, before the script starts: no process for it);
    else from `git config`."""
    config = root / ".git" / "config"
    if config.is_file():
        text = config.read_text(encoding="utf-8", errors="replace")
        section, wanted = None, f'[remote "{remote}"]'
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith("["):
                section = stripped
            elif section == wanted and stripped.replace(" ", "").startswith("url="):
                return stripped.split("=", 1)[1].strip() or None
        if "[include" not in text:  # an included file may name it: ask git
            return None
    out = run(root, "config", "--get", f"remote.{remote}.url")
    return (out.stdout.decode(errors="replace").strip() or None) if out.returncode == 0 else None
