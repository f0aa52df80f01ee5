"""`cascade ARGS` in this process, then its own CPU seconds (all its threads, not its children:
the script, git) appended to the file $BENCH_CPU_FILE, however the command leaves (a finished
`cascade run` leaves through os._exit)."""

import os
import resource
import sys


def note_cpu() -> None:
    used = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["BENCH_CPU_FILE"], "a") as out:
        out.write(f"{used.ru_utime + used.ru_stime}\n")


leave = os._exit


def exit_noting_cpu(code: int) -> None:
    note_cpu()
    leave(code)


os._exit = exit_noting_cpu  # type: ignore[assignment]
from cascade_repro.cli import main  # noqa: E402

try:
    main(sys.argv[1:])
finally:
    note_cpu()
