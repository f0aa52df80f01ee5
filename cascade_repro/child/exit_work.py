"""cascade's own work at the script's end (the trace's last records, the metrics still queued, the
exit facts), done however the script ends: at exit (atexit), and where it ends with `os._exit()`,
which skips atexit (a distributed script that will not wait on its process group, a preemption
handler of its own, a framework's worker). Without it such a run said FINISHED with the trace of its
first half second.

The script's own atexit handlers are left as `os._exit` leaves them: not run. A forked copy of the
script's process (a DataLoader worker, multiprocessing's child, which end with `os._exit`) ends as it
would: the work is the process's that installed it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Callable, NoReturn

# How long `os._exit` waits for each part of the work. It is done in threads of their own: called from
# a signal handler, `os._exit` may have interrupted the script inside one of cascade's hooks, holding
# the lock a part needs (the trace's); that part never ends then, and the exit goes on without it.
HARD_EXIT_WAIT_S = 10.0

_work: list[Callable[[], Any]] = []  # in the order registered; done last-registered first, as atexit


def at_exit(function: Callable[..., Any], *args: Any) -> None:
    """`function(*args)` at the script's end, atexit's or `os._exit`'s, once (a library's atexit
    handler that runs after cascade's may itself end the process with `os._exit`)."""
    done: list[bool] = []

    def once() -> None:
        if not done:
            done.append(True)
            function(*args)

    atexit.register(once)
    _work.append(once)


def install(wait_s: float = HARD_EXIT_WAIT_S) -> None:
    """`os._exit` does the work first, in this process."""
    pid = os.getpid()
    hard_exit = os._exit

    def _exit(status: int) -> NoReturn:
        if os.getpid() == pid and _work:
            _do_work(status, wait_s)
        hard_exit(status)

    os._exit = _exit


def _do_work(status: int, wait_s: float) -> None:
    """Each part in a thread of its own, waited for up to `wait_s`: one that cannot end (the trace's,
    its lock held) keeps none of the others from being done."""
    work = _work[::-1]
    _work.clear()  # once (the work itself, or another thread, may end the process the same way)
    stuck = 0
    for function in work:
        thread = threading.Thread(target=_quietly, args=(function,), name="cascade-exit", daemon=True)
        thread.start()
        thread.join(wait_s)
        stuck += thread.is_alive()
    if stuck:
        sys.stderr.write(f"cascade: the script called os._exit({status}); {stuck} part(s) of the run's last "
                         f"records were not written within {wait_s:.0f} s (os._exit came inside cascade's "
                         "step hooks, or a disk hangs): its trace or metrics may end early\n")  # fmt: skip


def _quietly(function: Callable[[], Any]) -> None:
    try:
        function()
    except BaseException:  # noqa: BLE001 - the exit is the script's, whatever cascade's work met
        pass
