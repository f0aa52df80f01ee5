"""`cascade run --nproc-per-node N`: torchrun, started by cascade, every rank a bootstrap.

    python -m cascade_repro.child.launch_ranks N SCRIPT|-m MODULE [ARGS]...

torchrun's own launcher (`torch.distributed.run`, in this process: it is the agent) starts N copies of
`python -m cascade_repro.child.bootstrap SCRIPT ARGS` with RANK, WORLD_SIZE, MASTER_ADDR/PORT set, over
a c10d rendezvous on a free local port (`--standalone`). Each rank writes its own trace (rank K > 0 in
ranks/K/ of the run directory). This process stops when `cascade run` dies and the ranks stop when it
does; torchrun passes Ctrl-C and SIGTERM on to them. It exits with the code of the first rank that
failed (torchrun itself says 1), 128 + N when a signal N stopped the job.
"""

from __future__ import annotations

import os
import sys

from cascade_repro.child import protocol
from cascade_repro.child.parent_watch import stop_with_parent


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write("usage: python -m cascade_repro.child.launch_ranks NPROC SCRIPT [ARGS]...\n")
        raise SystemExit(2)
    nproc, script_and_args = int(argv[0]), argv[1:]
    stop_with_parent()
    os.environ[protocol.ENV_PARENT_PID] = str(os.getpid())  # the ranks stop when this agent dies
    code = run_torchrun(["--standalone", f"--nproc-per-node={nproc}", "--module",
                         "cascade_repro.child.bootstrap", *script_and_args])  # fmt: skip
    raise SystemExit(code)


def run_torchrun(arguments: list[str]) -> int:
    """torchrun's agent with `arguments` (its command line), in this process, until its ranks end: 0,
    the code of the first rank that failed (torchrun itself says 1), or 128 + N for a signal N."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(arguments))
    except RendezvousError as exc:  # the other nodes never came, or the endpoint cannot be reached
        sys.stderr.write(f"cascade: the nodes did not meet at the rendezvous: {type(exc).__name__}: {exc}\n")
        return 1
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = failure.exitcode if failure.exitcode >= 0 else 128 - failure.exitcode
        sys.stderr.write(f"cascade: rank {rank} of the torchrun job exited with code {code}\n")
        return code or 1
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
