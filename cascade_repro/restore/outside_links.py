"""Committed links that reach out of the repository (`data -> ../datasets`, a dataset on shared
storage beside the checkout), in a restore's worktree.

The worktree lies deeper than the checkout (`.cascade/restore/LABEL/`), so a relative link that
climbs out of it dangles there, and the re-run failed inside the script. For each such link that
reaches something from the checkout, the worktree gets the same reach: where the link lands in
`.cascade/restore/` (one level above the worktree, as the checkout's parent is above the
checkout), a link of cascade's own (`.cascade/restore/datasets` -> the checkout's `../datasets`).
What such links reach is not recorded (the run named those reads as outside the repository): the
restore says so for each, and the re-run reads them as they are now.

Only where the link lands at the same path below `.cascade/restore/` as below the checkout's parent:
a link climbing further, a worktree elsewhere (`--workdir`), the checkout's own name, or a name
there already taken (a restore's worktree) gets no link of ours; the restore says why and how to
make the link work. A restore into a link of ours (a version named as the dataset) is refused
(restore/worktree.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

from cascade_repro.confined import SYMLINK_MODE
from cascade_repro.settings import ProjectPaths
from cascade_repro.store import git_repo


def reach_outside(root: Path, workdir: Path, notify: Callable[[str], None]) -> None:
    """Give the worktree's committed links out of the repository what they reach from the checkout."""
    ours = ProjectPaths(root).restores
    for link, target in _committed_links(workdir):
        if os.path.isabs(target):  # (reaches the same place from anywhere)
            continue
        from_worktree = os.path.normpath(os.path.join(workdir, os.path.dirname(link), target))
        from_checkout = os.path.normpath(os.path.join(root, os.path.dirname(link), target))
        if _inside(from_worktree, str(workdir)) or not os.path.exists(from_checkout):
            continue  # (inside, or dangling in the checkout too)
        reached = os.path.realpath(from_checkout)
        if _inside(reached, os.path.realpath(root)):
            continue  # (out and back into the repository: its own files)
        said = f"the committed link {link} -> {target} reaches {reached}, outside the repository"
        problem = None
        if os.path.realpath(from_worktree) != reached:  # (--workdir beside the checkout: it does already)
            problem = _link_beside(workdir, ours, root, from_worktree, from_checkout)
        if problem is not None:
            notify(f"{said}; {problem}")
        else:
            notify(f"{said}: not recorded (the re-run reads it as it is now)")


def _link_beside(workdir: Path, ours: Path, root: Path, landing: str, from_checkout: str) -> str | None:
    """A link of ours where `landing` (beside the worktree) begins, to the same place beside the
    checkout, where the link lands at the same path below each; why there is none otherwise."""
    cannot = "the re-run cannot reach it from the restore's worktree"
    way_out = "make the link absolute, or restore with --workdir beside the checkout"
    below = os.path.relpath(landing, ours) if workdir.parent == ours and _inside(landing, str(ours)) else None
    if below is None or below == "." or below != os.path.relpath(from_checkout, root.parent):
        return f"{cannot} ({way_out})"  # (a worktree elsewhere, a link climbing further)
    name = Path(below).parts[0]
    ours_link, beside_checkout = ours / name, str(root.parent / name)
    if name == root.name or name.startswith("."):  # (never the checkout itself, nor a hidden entry)
        return f"{cannot} ({way_out})"
    try:
        os.symlink(beside_checkout, ours_link)
    except FileExistsError:  # (ours already, from an earlier restore or one beside this one)
        if not (ours_link.is_symlink() and os.readlink(ours_link) == beside_checkout):
            return f"{cannot}: {ours_link} is taken ({way_out})"
    return None


def _committed_links(workdir: Path) -> Iterator[tuple[str, str]]:
    """(path, target) of the symlinks the worktree's index holds."""
    out = git_repo.run(workdir, "ls-files", "-s", "-z")
    if out.returncode != 0:
        return
    for entry in git_repo.names(out.stdout):
        head, _, path = entry.partition("\t")
        if head.split(" ")[0] != SYMLINK_MODE or not path:
            continue
        try:
            yield path, os.readlink(workdir / path)
        except OSError:  # (not a link in the worktree: the patch replaced it)
            continue


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)
