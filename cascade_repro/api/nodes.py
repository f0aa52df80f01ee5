"""`cascade run --nnodes N --nproc-per-node M --rdzv-endpoint HOST:PORT train.py`, the same on each node.

This process is the node's torchrun agent (torch.distributed.run, in-process). It meets the other
nodes' agents at the c10d rendezvous and starts this node's M ranks, each its own
`python -m cascade_repro.cli run OPTIONS train.py ARGS`: to cascade, a rank of a torchrun job
(distributed.joined), as with the user's own torchrun. Rank 0's `cascade run` records the job's one
run; the first rank of each other node delivers its node's ranks into it through the store
(node_exchange.py). This process records nothing itself: it exits with the job's code on its node.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Sequence

from cascade_repro.distributed import NodesLaunch, job_name
from cascade_repro.run_plan import Notify


def run_on_nodes(launch: NodesLaunch, target: Sequence[str], script_rel: str, args: Sequence[str],
                 commit: str, rank_options: Sequence[str], rdzv_id: str | None, cwd: Path,
                 notify: Notify) -> int:  # fmt: skip
    """This node's part of the job (`target`: the script, or `-m MODULE`), until its ranks end: their
    exit code (see launch_ranks)."""
    from cascade_repro.child.launch_ranks import run_torchrun

    job = job_name(rdzv_id) if rdzv_id else default_rdzv_id(launch, commit, script_rel, args)
    notify(f"node of a {launch.nnodes}-node job {job}: {launch.nproc_per_node} rank(s) here, meeting the "
           f"others at {launch.endpoint}")  # fmt: skip
    if Path.cwd() != cwd:
        os.chdir(cwd)  # torchrun starts the ranks where it runs
    return run_torchrun([
        f"--nnodes={launch.nnodes}", f"--nproc-per-node={launch.nproc_per_node}", "--rdzv-backend=c10d",
        f"--rdzv-endpoint={launch.endpoint}", f"--rdzv-id={job}",
        "--module", "cascade_repro.cli", "run", *rank_options, *target, *args,
    ])  # fmt: skip


def default_rdzv_id(launch: NodesLaunch, commit: str, script_rel: str, args: Sequence[str]) -> str:
    """The job id every node makes alike from what they all run (the same commit, script, arguments
    and layout): rank 0's run is told from an earlier run of the same job by being the RUNNING one."""
    said = json.dumps([launch.endpoint, launch.nnodes, launch.nproc_per_node, commit, script_rel, list(args)])
    return "cascade-" + hashlib.sha256(said.encode()).hexdigest()[:16]


def one_seed(seed: str | None) -> str | None:
    """`--seed random` drawn once for the job: every rank's `cascade run` would draw its own."""
    return str(secrets.randbelow(2**31)) if seed == "random" else seed
