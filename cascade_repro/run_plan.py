"""What `cascade run` decided before the child starts, and what it returns: RunPlan, RunResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from cascade_repro import run_target
from cascade_repro.distributed import Distributed
from cascade_repro.errors import EXIT_INCOMPLETE
from cascade_repro.manifest import Manifest
from cascade_repro.params import ResolvedParams
from cascade_repro.settings import Settings

if TYPE_CHECKING:
    from cascade_repro.images.prepare import PreparedImage

Notify = Callable[[str], None]


@dataclass(frozen=True)
class RunPlan:
    """Everything decided before the child starts (cheap checks only; see api.run)."""

    settings: Settings
    script: Path  # absolute (`-m MODULE`: the module's file)
    script_rel: str  # relative to the repo root
    args: tuple[str, ...]
    cwd: Path
    commit: str
    params: ResolvedParams
    determinism: str
    run_name: str | None
    environ: Mapping[str, str]
    exclude: tuple[str, ...]  # cascade's own files, never recorded as user state
    invocation: tuple[str, ...] = field(default_factory=tuple)
    extra_tags: Mapping[str, str] = field(default_factory=dict)  # e.g. cascade.restored_from
    container: ContainerPlan | None = None  # `--docker`: the child runs in this image
    trace_schedule: tuple[tuple[int, int], ...] | None = None  # restore: the recorded sampling schedule
    trace_records: tuple[tuple[int, int], ...] | None = None  # restore: the recorded steps with a record
    track_inputs: bool = False  # `--track-inputs`: read files git and DVC cannot see go to the DVC cache
    distributed: Distributed | None = None  # a torchrun job: `--nproc-per-node`, or rank 0 of the user's
    module: str | None = None  # `cascade run -m MODULE`: run by its name (run_target.py)

    @property
    def target(self) -> list[str]:
        """What follows `python` (or the bootstrap) to run it: `-m MODULE`, else the script's path."""
        return run_target.words(str(self.script), self.module)

    @property
    def shown(self) -> str:
        """It as the user would type it: `-m MODULE`, else the script relative to the repository."""
        return " ".join(run_target.words(self.script_rel, self.module))


@dataclass(frozen=True)
class ContainerPlan:
    """`cascade run --docker`: the image (built or reused before the run) and how to start it."""

    prepared: PreparedImage
    gpus: str | int | None  # "all", a count, or None
    shm_size: str
    network: str
    client: Any = field(default=None, compare=False, repr=False)  # the Docker SDK client that chose the image

    def record(self) -> dict[str, object]:
        return {
            **self.prepared.record(),
            "gpus": self.gpus,
            "shm_size": self.shm_size,
            "network": self.network,
        }


@dataclass(frozen=True)
class RunResult:
    """How a `cascade run` ended: the run, its status and the script's exit code, the record as
    stored, its warnings and what is still pending."""

    run_id: str
    status: str
    exit_code: int
    tracking_uri: str
    experiment: str
    manifest: Manifest
    warnings: tuple[str, ...]
    version: str | None = None
    # What the store lacks (pending or refused), one line each: exit 4 when the script exited 0.
    incomplete: tuple[str, ...] = ()
    spool: str | None = None  # the run directory kept with what is pending, for `cascade sync`
    usage_error: str | None = None  # argparse refused the script's arguments: the line it printed
    discarded: bool = False  # it did so before the first step: the run was deleted from the store
    rank: int | None = None  # rank K > 0 of the user's torchrun job: rank 0's `cascade run` records it
    nodes: int | None = None  # `--nnodes N`: this node's torchrun ended; rank 0's `cascade run` recorded
    # the last values of metrics the script logged into the run through MLflow itself (a framework's
    # own logger: HF's MLflowCallback, Lightning's MLFlowLogger), as the store holds them at the end
    logged: Mapping[str, float] = field(default_factory=dict)
    # a signal this `cascade run` got from outside while the script ran (Ctrl-C, SIGTERM), whatever
    # the script did with it; not one the script died of by itself (a segfault, the OOM killer)
    signal_received: int | None = None

    @property
    def exit_status(self) -> int:
        """`cascade run`'s exit code: the script's own, or 4 where it exited 0 but the record is
        incomplete (the script's own failure code wins)."""
        return EXIT_INCOMPLETE if self.exit_code == 0 and self.incomplete else self.exit_code
