"""Multi-process runs: one cascade run per torchrun job, rank 0 owning it, every rank's trace in it.

Two ways in, one record:

- `cascade run --nproc-per-node N train.py`: cascade starts torchrun (child/launch_ranks.py), whose
  N workers each run the bootstrap; rank K > 0 writes its files in `ranks/K/` of the run directory.
- the user's own `torchrun ... cascade run train.py`: one `cascade run` per rank. Rank 0's records
  the run; every other rank's only runs its script, writing in `ranks/K/` of a job directory named
  by the rendezvous id (`.cascade/jobs/ID`), and says how it ended there; rank 0's waits for them.
- `cascade run --nnodes N --rdzv-endpoint HOST:PORT` on each node (api/nodes.py) is the same as the
  user's torchrun: each node's torchrun starts one `cascade run` per rank. The ranks of other nodes
  than rank 0's cannot reach its files: each such node's first rank delivers its node's traces and
  exits into rank 0's run through the store, which it finds by the job's tag (node_exchange.py).

The record's `distributed` section says how the job was laid out (class A: world size) and where each
rank's trace is; `verify` and `restore` compare rank by rank.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from cascade_repro.child import protocol
from cascade_repro.errors import UsageError
from cascade_repro.record_sections import error_line
from cascade_repro.settings import ProjectPaths
from cascade_repro.store.spool import read_json

LAUNCHED = "cascade"  # cascade run --nproc-per-node N started torchrun
JOINED = "torchrun"  # the user's torchrun started one cascade run per rank
MAX_NPROC_PER_NODE = 256
MAX_WORLD_SIZE = 65536
# What torchrun sets for each process of a job: a property of the job (its world size is compared in
# the record's stack), never a cause of its own, and set again by the torchrun of a restore.
LAUNCHER_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
})  # fmt: skip
LAUNCHER_PREFIXES = ("TORCHELASTIC_",)
RANK_WAIT_S = 120.0  # rank 0's cascade run waits this long for the others' to say how they ended
JOB_TAG = "cascade.job"  # on rank 0's run of a torchrun job: the rendezvous id, for the other nodes
MAX_NNODES = 4096
DEFAULT_RDZV_PORT = 29400  # torchrun's own default for a c10d endpoint without a port


@dataclass(frozen=True)
class Distributed:
    """How a multi-process job is laid out, seen from the `cascade run` that records it (rank 0's)."""

    launcher: str  # LAUNCHED or JOINED
    world_size: int
    nproc_per_node: int
    nnodes: int
    rank: int = 0  # JOINED: the rank of this process's script
    job: str | None = None  # JOINED: the rendezvous id all ranks share
    local_rank: int = 0  # JOINED: its rank on its node (LOCAL_RANK)

    def ranks_dir(self, run_dir: Path, settings_root: Path) -> Path:
        """Where ranks 1.. write (ranks/K/ below it): the run directory, or the job's."""
        return self.job_dir(settings_root) if self.job else run_dir

    def job_dir(self, root: Path) -> Path:
        assert self.job is not None
        return ProjectPaths(root).jobs / self.job

    @property
    def node_ranks(self) -> range:
        """The ranks on this process's node (torchrun numbers a node's ranks one after the other)."""
        first = self.rank - self.local_rank
        return range(first, min(first + self.nproc_per_node, self.world_size))

    @property
    def local_ranks(self) -> range:
        """The ranks of this node other than its first, whose files this machine has (rank 0's node:
        1..nproc_per_node-1)."""
        return self.node_ranks[1:]

    @property
    def remote_ranks(self) -> range:
        """The ranks on other nodes than this one's, which rank 0 hears of through the store."""
        return range(self.node_ranks.stop, self.world_size) if self.rank == 0 else range(0)

    @property
    def leads_another_node(self) -> bool:
        """This rank is the first of a node other than rank 0's: it delivers its node's ranks."""
        return self.launcher == JOINED and self.local_rank == 0 and self.rank > 0

    def section(self, ranks: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "launcher": self.launcher,
            "world_size": self.world_size,
            "nproc_per_node": self.nproc_per_node,
            "nnodes": self.nnodes,
            "ranks": ranks,
        }


def is_launcher_variable(name: str) -> bool:
    return name in LAUNCHER_VARIABLES or name.startswith(LAUNCHER_PREFIXES)


def launched(nproc_per_node: int | None, environ: Mapping[str, str]) -> Distributed | None:
    """`--nproc-per-node N`: the layout cascade's own torchrun gets (one node)."""
    if nproc_per_node is None:
        return None
    if not 1 <= nproc_per_node <= MAX_NPROC_PER_NODE:
        raise UsageError(f"--nproc-per-node must be from 1 to {MAX_NPROC_PER_NODE}, not {nproc_per_node}")
    if "RANK" in environ and "WORLD_SIZE" in environ:
        raise UsageError(
            "--nproc-per-node inside a torchrun job: this process is rank "
            f"{environ.get('RANK')} of {environ.get('WORLD_SIZE')} already",
            hint="either let cascade start torchrun (cascade run --nproc-per-node N train.py) or run "
            "`torchrun ... cascade run train.py` without --nproc-per-node",
        )
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError("--nproc-per-node starts torchrun, which comes with torch: torch is not installed",
                         hint="pip install torch")  # fmt: skip
    return Distributed(LAUNCHED, nproc_per_node, nproc_per_node, 1)


@dataclass(frozen=True)
class NodesLaunch:
    """`cascade run --nnodes N --rdzv-endpoint HOST:PORT`: this node's part of a job over N nodes."""

    nnodes: int
    nproc_per_node: int
    endpoint: str  # HOST:PORT of torchrun's c10d rendezvous, the same on every node


def nodes_launch(nnodes: int | None, nproc_per_node: int | None, endpoint: str | None,
                 environ: Mapping[str, str]) -> NodesLaunch | None:  # fmt: skip
    """The checked multi-node options, None without --nnodes; every refusal names the fix."""
    if nnodes is None:
        if endpoint is not None:
            raise UsageError("--rdzv-endpoint goes with --nnodes",
                             hint="cascade run --nnodes N --rdzv-endpoint HOST:PORT ... on each of the N "
                             "nodes")  # fmt: skip
        return None
    if not 1 <= nnodes <= MAX_NNODES:
        raise UsageError(f"--nnodes must be from 1 to {MAX_NNODES}, not {nnodes}")
    if endpoint is None:
        raise UsageError(
            "--nnodes needs the rendezvous all nodes meet at: --rdzv-endpoint HOST:PORT",
            hint="the same HOST:PORT on every node: HOST one of them, PORT free there (torchrun's c10d "
            f"rendezvous; {DEFAULT_RDZV_PORT} if left out)",
        )
    host, _, port = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", str(DEFAULT_RDZV_PORT))
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"--rdzv-endpoint must be HOST:PORT (a port from 1 to 65535), not {endpoint!r}")
    single = launched(nproc_per_node or 1, environ)  # the same refusals as one node's
    assert single is not None
    return NodesLaunch(nnodes, single.nproc_per_node, f"{host}:{port}")


def joined(environ: Mapping[str, str]) -> Distributed | None:
    """This `cascade run` is one rank of the user's torchrun job (RANK and WORLD_SIZE set, more than
    one process), else None."""
    try:
        world_size = int(environ.get("WORLD_SIZE", "1"))
        rank = int(environ.get("RANK", "0"))
        local = int(environ.get("LOCAL_WORLD_SIZE", str(world_size)))
        local_rank = int(environ.get("LOCAL_RANK", str(rank % max(local, 1))))
    except ValueError:
        return None
    if "RANK" not in environ or world_size <= 1 or not 0 <= rank < world_size:
        return None
    local = min(max(local, 1), world_size)
    local_rank = local_rank if 0 <= local_rank < local and local_rank <= rank else rank % local
    key = environ.get("TORCHELASTIC_RUN_ID") or f"{environ.get('MASTER_ADDR')}-{environ.get('MASTER_PORT')}"
    nnodes = max(world_size // local, 1)
    return Distributed(JOINED, world_size, local, nnodes, rank, job_name(key), local_rank)


def job_name(key: str) -> str:
    """A rendezvous id as a directory name and a tag value (letters, digits, `._-`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)[:100].lstrip(".") or "job"


def collect_ranks(layout: Distributed, ranks_dir: Path, notify: Callable[[str], None],
                  wait_s: float = RANK_WAIT_S) -> list[dict[str, Any]]:  # fmt: skip
    """Each other rank on this machine, once it ended: its trace file (path), steps, exit and error.

    JOINED: the ranks' own `cascade run`s write `exit.json` when their script ended; wait for them
    (they end together, give or take the last collective). LAUNCHED: torchrun has ended them all."""
    started = time.monotonic()
    told = False
    entries = []
    for rank in layout.local_ranks:
        own = protocol.rank_dir(ranks_dir, rank)
        ended = own / protocol.RANK_EXIT_FILE
        while layout.launcher == JOINED and not ended.exists() and time.monotonic() - started < wait_s:
            if not told and time.monotonic() - started > 2:
                notify(f"waiting for rank {rank} (and the others) to end, up to {wait_s:.0f} s")
                told = True
            time.sleep(0.05)
        entries.append(rank_entry(rank, own, ended if layout.launcher == JOINED else None))
    return entries


def rank_entry(rank: int, own: Path, ended: Path | None) -> dict[str, Any]:
    facts = read_json(own / protocol.FACTS_FILE)
    trace = own / protocol.TRACE_FILE
    entry: dict[str, Any] = {"rank": rank, "error": facts.get("exception")}
    if ended is not None:
        exit_code = read_json(ended).get("exit_code")
        entry["exit_code"] = exit_code if isinstance(exit_code, int) else None
        if not ended.exists():
            entry["missing"] = "its cascade run did not say how it ended (still running, or on another node)"
    if trace.exists() and facts.get("trace"):
        with open(trace, "rb") as handle:
            steps = sum(1 for line in handle if line.strip())
        entry["trace"] = {"artifact": trace_artifact(rank), "steps": steps}
    return entry


def gather(layout: Distributed, source: Path, run_dir: Path) -> list[tuple[Path, str]]:
    """Move each rank's files into ranks/K/ of the run directory (JOINED: from the job directory, which
    then goes) and name what to store: (file, artifact directory) for each trace and output log."""
    import shutil

    stored = []
    for rank in layout.local_ranks:
        own, kept = protocol.rank_dir(source, rank), protocol.rank_dir(run_dir, rank)
        if own != kept and own.is_dir():
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(kept, ignore_errors=True)
            os.replace(own, kept)
        for name in (protocol.TRACE_FILE, protocol.OUTPUT_LOG):
            if (kept / name).is_file():
                stored.append((kept / name, f"cascade/ranks/{rank}"))
    if source != run_dir:
        leave_job_dir(source, layout.local_ranks)
    return stored


def leave_job_dir(job_dir: Path, ranks: range) -> None:
    """This node's ranks' files out of the job directory, and the directory once nothing else is in
    it: on a shared filesystem the other nodes' ranks write beside them, at the same path."""
    import shutil

    for rank in ranks:
        shutil.rmtree(protocol.rank_dir(job_dir, rank), ignore_errors=True)
    (job_dir / protocol.RUN_ID_FILE).unlink(missing_ok=True)
    for empty in (job_dir / protocol.RANKS_DIR, job_dir):
        try:
            empty.rmdir()
        except OSError:
            pass  # another node's ranks are still there; the last to leave removes it


def rank_warnings(section: Mapping[str, Any]) -> list[str]:
    """One line per rank that failed, left no trace where rank 0 has one, or never said it ended."""
    lines = []
    for entry in section.get("ranks") or []:
        rank = entry.get("rank")
        if entry.get("missing"):
            lines.append(f"rank {rank}: {entry['missing']}")
        elif entry.get("exit_code") or entry.get("error"):
            how = f"exited with code {entry['exit_code']}" if entry.get("exit_code") else "failed"
            said = error_line(entry.get("error"), limit=200)
            said = f": {said}" if said else ""
            lines.append(f"rank {rank} {how}{said}")
    return lines


def from_section(section: Mapping[str, Any]) -> Distributed | None:
    """The layout a spooled record names (for a recoverer), trusting only its numbers' shape."""
    if not section:
        return None
    numbers = [section.get(k, 1) for k in ("world_size", "nproc_per_node", "nnodes")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in numbers):
        return None
    return Distributed(str(section.get("launcher") or LAUNCHED), *numbers)


def trace_artifact(rank: int) -> str:
    """The MLflow artifact holding rank `rank`'s step trace (rank 0's is cascade/trace.jsonl)."""
    return f"cascade/{protocol.TRACE_FILE}" if rank == 0 else f"cascade/ranks/{rank}/{protocol.TRACE_FILE}"


def check_section(section: Any, refuse: Callable[[str, Any, str], None]) -> None:
    """A record's `distributed` section has the shape restore and verify act on (it may be hostile:
    restore starts nproc_per_node processes, verify reads a trace per rank)."""
    if section is None:
        return
    if not isinstance(section, dict):
        refuse("distributed", section, "null or an object")
    for key, top in (("world_size", MAX_WORLD_SIZE), ("nproc_per_node", MAX_NPROC_PER_NODE),
                     ("nnodes", MAX_NNODES)):  # fmt: skip
        value = section.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            refuse(f"distributed.{key}", value, f"an integer from 1 to {top}")
    ranks = section.get("ranks", [])
    if not isinstance(ranks, list) or len(ranks) >= section.get("world_size", 1):
        refuse("distributed.ranks", ranks, "a list of fewer entries than the world size")
    for index, entry in enumerate(ranks):
        rank = entry.get("rank") if isinstance(entry, dict) else None
        size = section.get("world_size", 1)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank < size:
            refuse(f"distributed.ranks[{index}].rank", rank, "a rank from 1 to world_size - 1")


class RankFollower:
    """Rank K > 0 of the user's torchrun job: run the script, tell rank 0's `cascade run` how it ended."""

    def __init__(self, layout: Distributed, root: Path) -> None:
        self.layout = layout
        self.job_dir = layout.job_dir(root)
        self.own = protocol.rank_dir(self.job_dir, layout.rank)

    def prepare(self) -> Path:
        """The job directory the child is given (it writes in ranks/K/ of it), made empty for this rank."""
        self.own.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in (protocol.RANK_EXIT_FILE, protocol.TRACE_FILE, protocol.FACTS_FILE):
            (self.own / name).unlink(missing_ok=True)
        return self.job_dir

    def ended(self, exit_code: int) -> None:
        ended = {"exit_code": exit_code, "pid": os.getpid()}
        protocol.write_json_atomic(self.own / protocol.RANK_EXIT_FILE, ended, last_words=True)
