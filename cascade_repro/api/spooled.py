"""Spooled runs: `cascade sync` / `cascade recover`, and the check every store command makes first."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cascade_repro.errors import EXIT_INCOMPLETE, EXIT_OK
from cascade_repro.project import find_repo_root
from cascade_repro.run_plan import Notify
from cascade_repro.settings import Settings, load_settings
from cascade_repro.store import spool

if TYPE_CHECKING:
    from cascade_repro.recovery import Delivered

log = logging.getLogger("cascade_repro.recovery")


@dataclass(frozen=True)
class SyncResult:
    """`cascade sync`/`recover`: one `Delivered` per run directory (none: nothing was pending)."""

    delivered: tuple[Delivered, ...]

    @property
    def exit_status(self) -> int:
        """0: nothing left pending; 4: some of it is still pending or was refused."""
        return EXIT_INCOMPLETE if any(d.missing for d in self.delivered) else EXIT_OK


def sync(cwd: Path | None = None, notify: Notify = lambda message: None, command: str = "sync") -> SyncResult:
    """Deliver every spooled run whose parent is gone; close the ones now complete."""
    from cascade_repro.recovery import sync as deliver_all

    settings = load_settings(find_repo_root(cwd))
    return SyncResult(tuple(deliver_all(settings, notify, f"`cascade {command}`")))


def finish_dead_runs(settings: Settings, notify: Notify | None = None,
                     background: bool = False) -> threading.Thread | None:  # fmt: skip
    """Recover runs whose `cascade run` died, before a command uses the store.

    One listing of .cascade/runs when there are none; never fails the command (a run that cannot
    be delivered now stays spooled for `cascade sync`). With `background` (`cascade run`: the new
    script must not wait for an old run's delivery, which may wait out a store's retry budget) the
    delivery runs in a thread the caller joins."""
    entries = spool.scan_all(settings.paths.spool_dirs())
    say = notify or (lambda message: log.warning("%s", message))
    waiting = sum(entry.state == spool.PENDING for entry in entries)
    if waiting and notify is not None:  # `cascade run` says it; `cascade ls` shows them PENDING-SYNC
        say(f"{waiting} earlier run(s) still have records pending delivery: `cascade sync` delivers them")
    if not any(entry.state == spool.DEAD for entry in entries):
        return None

    def recover() -> None:
        try:
            from cascade_repro.recovery import recover_dead

            recover_dead(settings, say, f"the next cascade command (pid {os.getpid()})", entries)
        except Exception as exc:  # the command itself must still run
            say(f"could not recover the runs of dead cascade processes now ({type(exc).__name__}: "
                f"{exc}); `cascade recover` tries again")  # fmt: skip

    if not background:
        recover()
        return None
    thread = threading.Thread(target=recover, name="cascade-recover", daemon=True)
    thread.start()
    return thread
