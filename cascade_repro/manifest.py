"""The run record (`cascade/run.json`): a frozen, schema-versioned document, read and written here.

`Manifest.from_dict` is the one way in: the schema version and the whole JSON shape are checked
(`record_shape`), then the sections become typed objects (`record_sections`); `to_dict` is the one
way out. Sections cascade does not act on field by field (command, params, determinism, environment,
trace, metrics, distributed) stay plain JSON objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from cascade_repro.errors import CascadeError
from cascade_repro.record_sections import (
    CheckpointEntry,
    ContainerSection,
    DataEntry,
    FileEntry,
    GitSection,
    HardwareSection,
    Outcome,
    PythonSection,
    Section,
    TorchSection,
)  # fmt: skip
from cascade_repro.record_shape import check_shape

SCHEMA = "cascade.run/1"
ARTIFACT_PATH = "cascade/run.json"

_SECTIONS: dict[str, type[Section]] = {
    "git": GitSection, "python": PythonSection, "torch": TorchSection, "hardware": HardwareSection,
    "container": ContainerSection, "outcome": Outcome,
}  # fmt: skip
_ENTRIES: dict[str, type[Section]] = {
    "data": DataEntry, "checkpoints": CheckpointEntry, "inputs": FileEntry, "outputs": FileEntry,
}  # fmt: skip


@dataclass(frozen=True)
class Manifest:
    """One run, as recorded (or this machine, as a record without a run: see `here`).

    Built from JSON objects or sections alike: the typed sections wrap what they are given."""

    run_id: str
    experiment: str
    cascade_version: str = ""
    command: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    determinism: dict[str, Any] = field(default_factory=dict)
    git: GitSection = field(default_factory=GitSection)
    python: PythonSection = field(default_factory=PythonSection)
    torch: TorchSection = field(default_factory=TorchSection)
    hardware: HardwareSection = field(default_factory=HardwareSection)
    environment: dict[str, str] = field(default_factory=dict)
    container: ContainerSection = field(default_factory=ContainerSection)
    # the variables the script read (not allow-listed); None: a record that ran nothing (this machine)
    environment_read: dict[str, str | None] | None = None
    data: tuple[DataEntry, ...] = ()
    checkpoints: tuple[CheckpointEntry, ...] = ()
    trace: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    outcome: Outcome = field(default_factory=Outcome)
    # files in the repository the script read that neither git nor DVC tracks: path, size, sha256
    # (and md5 once in the DVC cache); and those the run wrote: path, size
    inputs: tuple[FileEntry, ...] = ()
    outputs: tuple[FileEntry, ...] = ()
    # a torchrun job: launcher, world_size, nproc_per_node, nnodes, and ranks 1.. (trace, exit, error)
    distributed: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name, kind in _SECTIONS.items():
            object.__setattr__(self, name, kind.of(getattr(self, name)))
        for name, kind in _ENTRIES.items():
            object.__setattr__(self, name, kind.each(getattr(self, name)))

    @property
    def variables_read(self) -> dict[str, str | None]:
        """The variables the script read ({} for a record that ran nothing)."""
        return self.environment_read or {}

    @property
    def ran(self) -> bool:
        """A record of a run (a record of this machine, made to compare against, ran nothing)."""
        return bool(self.command)

    @property
    def layout(self) -> dict[str, Any]:
        """The `distributed` section: a torchrun job's processes ({} for a single process)."""
        return self.distributed if isinstance(self.distributed, dict) else {}

    @property
    def world_size(self) -> int:
        value = self.layout.get("world_size", 1)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    @property
    def nnodes(self) -> int:
        """The machines the job ran on (1 for a single process)."""
        value = self.layout.get("nnodes", 1)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    @property
    def gpus(self) -> list[dict[str, Any]]:
        """The GPUs the run used: the ones torch saw, else the ones the machine has."""
        return self.torch.gpus or self.hardware.gpus

    @property
    def trace_header(self) -> Mapping[str, Any]:
        """The step trace's header (artifact, steps, interval, grads, ...); empty without a trace."""
        return self.trace or {}

    @property
    def seed(self) -> Any:
        return self.params.get("seed")

    @property
    def determinism_mode(self) -> str:
        return str(self.determinism.get("mode") or "warn")

    @property
    def data_objects(self) -> list[tuple[str, str]]:
        """(path, md5) of the bytes the run read: the workspace's when it differed from the pointer."""
        return [(d.path, d.object_md5) for d in self.data if d.object_md5]

    @property
    def kept_checkpoints(self) -> list[CheckpointEntry]:
        return [c for c in self.checkpoints if c.kept]

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Section):
                value = value.to_dict() if value or f.name != "outcome" else None
            elif f.name in _ENTRIES:
                value = [entry.to_dict() for entry in value]
            elif value is None and f.name == "environment_read":
                continue  # a record that ran nothing, read nothing: the key stays absent
            body[f.name] = value
        return {"schema": SCHEMA, **body}

    def with_outcome(self, outcome: Mapping[str, Any], **sections: Any) -> Manifest:
        return replace(self, outcome=Outcome.of(outcome), **sections)

    @classmethod
    def outcome_only(cls, run_id: str, experiment: str, cascade_version: str,
                     outcome: Mapping[str, Any]) -> Manifest:  # fmt: skip
        """No record, only how a script ended: rank K > 0 of the user's torchrun, whose run rank 0 records."""
        return cls(run_id, experiment, cascade_version, outcome=Outcome.of(outcome))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], run_id: str | None = None) -> Manifest:
        """A stored record, its schema and shape checked (`run_id` names the run in the errors)."""
        check_schema(data, run_id)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names and v is not None})


def check_schema(data: Mapping[str, Any], run_id: str | None = None) -> None:
    """Every reader goes through this: a record of another kind or a newer schema gets a clear error."""
    schema = str(data.get("schema", ""))
    where = f"run {run_id}: " if run_id else ""
    if not schema.startswith("cascade.run/"):
        raise CascadeError(f"{where}not a cascade run record (schema {schema!r})")
    if schema != SCHEMA:
        raise CascadeError(
            f"{where}run record schema {schema} is not one this cascade reads ({SCHEMA})",
            hint="upgrade cascade (pip install -U cascade-repro) to read records of newer versions",
        )
    check_shape(data, run_id)
