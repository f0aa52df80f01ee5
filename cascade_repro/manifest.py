"""The run record (`cascade/run.json`): a frozen, schema-versioned document, to_dict/from_dict."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from cascade_repro.errors import CascadeError

SCHEMA = "cascade.run/1"
ARTIFACT_PATH = "cascade/run.json"


@dataclass(frozen=True)
class Manifest:
    """One run, as recorded. Sections are plain JSON-able mappings, documented in DESIGN.md."""

    run_id: str
    experiment: str
    cascade_version: str
    command: dict[str, Any]
    params: dict[str, Any]
    determinism: dict[str, Any]
    git: dict[str, Any]
    python: dict[str, Any]
    torch: dict[str, Any]
    hardware: dict[str, Any]
    environment: dict[str, str]
    container: dict[str, Any]
    environment_read: dict[str, str | None] = field(
        default_factory=dict
    )  # read by the script, not allow-listed
    data: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    trace: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    outcome: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"schema": SCHEMA, **body}

    def with_outcome(self, outcome: dict[str, Any], **sections: Any) -> Manifest:
        return replace(self, outcome=outcome, **sections)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        check_schema(data)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


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


def data_objects(data: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(path, md5) of the bytes the run read: the workspace's when it differed from the pointer."""
    out = []
    for item in data:
        md5 = item.get("workspace_md5") or (item.get("md5") if item.get("matches") else None)
        if md5 and not str(md5).endswith(".dir"):
            out.append((str(item["path"]), str(md5)))
    return out
