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
make the link work. So does a link of ours that would lead into the checkout (`current -> proj`
beside it), and where a committed link reaches into the checkout through one (`../datasets/../proj`:
the kernel takes `..` after the link), the links of ours are removed and none is made. A restore
into a link of ours (a version named as the dataset) is refused (restore/worktree.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

from cascade_repro.confined import SYMLINK_MODE, within
from cascade_repro.settings import ProjectPaths
from cascade_repro.store import git_repo

CANNOT = "the re-run cannot reach it from the restore's worktree"
WAY_OUT = "make the link absolute, or restore with --workdir beside the checkout"


def reach_outside(root: Path, workdir: Path, notify: Callable[[str], None]) -> None:
    """Give the worktree's committed links out of the repository what they reach from the checkout."""
    ours = ProjectPaths(root).restores
    links = list(_committed_links(workdir))
    said: list[tuple[str, str | None]] = []  # (what the link reaches, why the worktree cannot)
    for link, target in links:
        if os.path.isabs(target):  # (reaches the same place from anywhere)
            continue
        from_worktree = os.path.normpath(os.path.join(workdir, os.path.dirname(link), target))
        from_checkout = os.path.normpath(os.path.join(root, os.path.dirname(link), target))
        if within(from_worktree, str(workdir)) or not os.path.exists(from_checkout):
            continue  # (inside, or dangling in the checkout too)
        reached = os.path.realpath(from_checkout)
        if within(reached, os.path.realpath(root)):
            continue  # (out and back into the repository: its own files)
        problem = None
        if os.path.realpath(from_worktree) != reached:  # (--workdir beside the checkout: it does already)
            problem = _link_beside(workdir, ours, root, from_worktree, from_checkout)
        said.append((f"the committed link {link} -> {target} reaches {reached}, outside the repository",
                     problem))  # fmt: skip
    into_checkout = _into_the_checkout(root, workdir, links)
    if into_checkout and _remove_ours(ours, root):  # (`../datasets/../proj/x`: through a link of ours)
        said = [(text, problem or f"{CANNOT} ({WAY_OUT})") for text, problem in said]
        for link in into_checkout:
            notify(f"the committed link {link} would reach your checkout through the links cascade makes "
                   f"beside the restore's worktree, so none is made ({WAY_OUT})")  # fmt: skip
    for text, problem in said:
        notify(f"{text}; {problem}" if problem is not None else f"{text}: not recorded (the re-run reads "
               "it as it is now)")  # fmt: skip


def _into_the_checkout(root: Path, workdir: Path, links: list[tuple[str, str]]) -> list[str]:
    """The committed relative links that reach into the user's checkout from the worktree (its own
    files, not the restores' beside it). An absolute one reaches it whatever links there are: it is
    the commit's own doing, as in a checkout of it."""
    real_root, restores = os.path.realpath(root), os.path.realpath(workdir.parent)
    found = []
    for link, target in links:
        if os.path.isabs(target):
            continue
        real = os.path.realpath(workdir / link)
        if within(real, real_root) and not within(real, restores):
            found.append(link)
    return found


def _remove_ours(ours: Path, root: Path) -> bool:
    """Remove the links of ours beside the restore worktrees (made again by the next restore that
    needs one); whether there were any."""
    beside_checkout = str(root.parent) + os.sep
    removed = False
    for entry in ours.iterdir() if ours.is_dir() else []:
        if entry.is_symlink() and os.readlink(entry).startswith(beside_checkout):
            entry.unlink()
            removed = True
    return removed


def _link_beside(workdir: Path, ours: Path, root: Path, landing: str, from_checkout: str) -> str | None:
    """A link of ours where `landing` (beside the worktree) begins, to the same place beside the
    checkout, where the link lands at the same path below each; why there is none otherwise."""
    cannot, way_out = CANNOT, WAY_OUT
    below = os.path.relpath(landing, ours) if workdir.parent == ours and within(landing, str(ours)) else None
    if below is None or below == "." or below != os.path.relpath(from_checkout, root.parent):
        return f"{cannot} ({way_out})"  # (a worktree elsewhere, a link climbing further)
    name = Path(below).parts[0]
    ours_link, beside_checkout = ours / name, str(root.parent / name)
    real_root, beside_real = os.path.realpath(root), os.path.realpath(beside_checkout)
    if name.startswith(".") or within(beside_real, real_root) or within(real_root, beside_real):
        return f"{cannot} ({way_out})"  # (never the checkout, what holds it or is in it; no hidden entry)
    try:
        os.symlink(beside_checkout, ours_link)
    except FileExistsError:  # (ours already, from an earlier restore or one beside this one)
        if not (ours_link.is_symlink() and os.readlink(ours_link) == beside_checkout):
            return f"{cannot}: {ours_link} is taken ({way_out})"
    except OSError as exc:  # (a full or read-only disk: the restore goes on, the link is said)
        return f"{cannot}: {ours_link} could not be made ({exc.strerror or exc}; {way_out})"
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

