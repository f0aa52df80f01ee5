"""The typed run record (issue 16): sections read in one place, accessors that coerce once, a record
that round-trips unchanged, and no module that reads a section as a raw mapping."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from cascade_repro.errors import CascadeError
from cascade_repro.manifest import SCHEMA, Manifest
from cascade_repro.record_sections import CheckpointEntry, DataEntry, GitSection, TorchSection, error_line
from tests.sources import matching_lines

RECORD: dict[str, Any] = {
    "schema": SCHEMA, "run_id": "r1", "experiment": "exp", "cascade_version": "0.1.0",
    "command": {"script": "train.py", "argv": ["--lr", "0.1"], "cwd": "."},
    "params": {"values": {"lr": 0.1}, "seed": 7, "seed_source": "option"},
    "determinism": {"mode": "warn", "applied": {}},
    "git": {"commit": "c" * 40, "branch": "main", "dirty": True, "remotes": {"origin": "u"},
            "patch": {"artifact": "cascade/git.patch", "sha256": "e" * 64, "size": 10},
            "untracked": [{"path": "n.txt", "size": 1, "sha256": "a" * 64, "stored": True}],
            "signed": "from a newer cascade"},
    "python": {"version": "3.11.7", "packages": {"numpy": {"version": "2.1.0"}, "pip": "24.0"}},
    "torch": {"version": "2.13.0+cpu", "probed": True, "num_threads": "8", "cuda": None, "gpus": []},
    "hardware": {"cpu": {"model": "Xeon", "count": 16}, "os": {"release": "6.1"}, "hostname": "h",
                 "memory_mb": 1024, "gpus": [{"name": "H200"}, "not a gpu"]},
    "environment": {"OMP_NUM_THREADS": "8"},
    "environment_read": {"DATA_DIR": "/d"},
    "container": {"image": "img:1", "image_id": "sha256:" + "1" * 64, "runtime": "docker", "shm_size": "2g"},
    "data": [{"path": "a.bin", "md5": "1" * 32, "matches": True},
             {"path": "b.bin", "md5": "2" * 32, "matches": False, "workspace_md5": "3" * 32},
             {"path": "c.bin", "md5": "4" * 32, "matches": False},
             {"path": "d", "md5": "5" * 32 + ".dir", "matches": True}],
    "checkpoints": [{"path": "c1.pt", "md5": "6" * 32, "status": "kept", "step": 1, "metrics": {"loss": 0.5},
                     "monitor": "loss"},
                    {"path": "c2.pt", "md5": None, "status": "pruned", "step": 2}],
    "trace": {"artifact": "cascade/trace.jsonl", "steps": 3, "interval": 1},
    "metrics": {"keys": {}}, "outcome": {"status": "FINISHED", "exit_code": 0, "start_time": 1.5},
    "inputs": [{"path": "in.csv", "size": 3, "sha256": "7" * 64}], "outputs": [],
    "distributed": {"launcher": "cascade", "world_size": 2, "nproc_per_node": 2, "nnodes": 1, "ranks": []},
}  # fmt: skip


def test_a_record_round_trips_unchanged_with_fields_this_cascade_does_not_know() -> None:
    manifest = Manifest.from_dict(copy.deepcopy(RECORD))
    assert json.loads(json.dumps(manifest.to_dict())) == RECORD
    assert manifest.git.get("signed") == "from a newer cascade"


def test_the_accessors_read_each_field_once_with_its_type() -> None:
    m = Manifest.from_dict(copy.deepcopy(RECORD))
    assert (m.git.commit, m.git.branch, m.git.dirty, m.git.patch_sha256) == ("c" * 40, "main", True, "e" * 64)
    assert [u.path for u in m.git.untracked] == ["n.txt"] and m.git.untracked[0].stored
    assert (m.python.minor, m.python.package_versions) == ("3.11", {"numpy": "2.1.0", "pip": "24.0"})
    assert (m.torch.version, m.torch.cuda, m.torch.num_threads, m.torch.probed) == (
        "2.13.0+cpu",
        None,
        8,
        True,
    )
    assert (m.hardware.cpu_model, m.hardware.cpu_count, m.hardware.os_release) == ("Xeon", 16, "6.1")
    assert m.gpus == [{"name": "H200"}]  # torch saw none: the machine's, without the junk entry
    assert (m.container.in_docker, m.container.shm_size) == (True, "2g")
    # the bytes the run read: the pointer's when it matched, the workspace's when not; a directory's .dir
    assert m.data_objects == [("a.bin", "1" * 32), ("b.bin", "3" * 32), ("d", "5" * 32 + ".dir")]
    assert [c.path for c in m.kept_checkpoints] == ["c1.pt"] and m.kept_checkpoints[0].metrics == {
        "loss": 0.5
    }
    assert (m.outcome.status, m.outcome.exit_code, m.outcome.start_time) == ("FINISHED", 0, 1.5)
    assert (m.world_size, m.seed, m.determinism_mode, m.trace_header["steps"]) == (2, 7, "warn", 3)
    assert m.ran and m.variables_read == {"DATA_DIR": "/d"}


def test_sections_are_typed_however_the_manifest_is_built() -> None:
    built = Manifest("r", "e", git={"commit": "c" * 40}, checkpoints=({"path": "x", "md5": "1" * 32,  # type: ignore[arg-type]
                                                                        "status": "kept"},))  # fmt: skip
    assert isinstance(built.git, GitSection) and isinstance(built.torch, TorchSection)
    assert isinstance(built.checkpoints[0], CheckpointEntry) and built.checkpoints[0].kept
    assert not built.ran and built.environment_read is None and "environment_read" not in built.to_dict()
    assert built.gpus == [] and not built.outcome and built.to_dict()["outcome"] is None


@pytest.mark.parametrize(
    "raw, num_threads, gpus",
    [
        ({"num_threads": True}, None, []),
        ({"num_threads": "x"}, None, []),
        ({"gpus": "unavailable: no smi"}, None, []),
    ],
)
def test_a_value_of_the_wrong_kind_reads_as_unknown(raw: dict[str, Any], num_threads: Any, gpus: Any) -> None:
    torch = TorchSection(raw)
    assert (torch.num_threads, torch.gpus) == (num_threads, gpus)


def test_a_data_entry_without_known_bytes_stands_for_none() -> None:
    assert DataEntry({"path": "x", "md5": "1" * 32, "matches": False}).object_md5 is None
    note = "not restorable: a modified directory"
    old = {"path": "x", "md5": "1" * 32 + ".dir", "matches": False, "note": note}
    assert DataEntry(old).object_md5 is None  # a record from before modified directories were committed


def test_a_directory_entry_stands_for_its_dir_object() -> None:
    assert DataEntry({"path": "x", "md5": "1" * 32 + ".dir", "matches": True}).object_md5 == "1" * 32 + ".dir"
    modified = {"path": "x", "md5": "1" * 32 + ".dir", "matches": False, "workspace_md5": "2" * 32 + ".dir"}
    assert DataEntry(modified).object_md5 == "2" * 32 + ".dir"


def test_the_one_way_in_checks_schema_and_shape() -> None:
    with pytest.raises(CascadeError, match="not one this cascade reads"):
        Manifest.from_dict({**RECORD, "schema": "cascade.run/2"})
    with pytest.raises(CascadeError, match="git is str"):
        Manifest.from_dict({**RECORD, "git": "c" * 40}, "r1")


@pytest.mark.parametrize(
    ("error", "line"),
    [
        ({"type": "RuntimeError", "message": "boom at half time"}, "RuntimeError: boom at half time"),
        ({"type": "KeyboardInterrupt", "message": ""}, "KeyboardInterrupt"),  # Ctrl-C: no message
        ({"type": "StopIteration", "message": None}, "StopIteration"),
        ({"type": "ValueError", "message": " \n"}, "ValueError"),
        ({"type": "OSError"}, "OSError"),
        (None, ""),
        ({}, ""),
    ],
)
def test_an_error_line_has_no_colon_without_a_message(error: Any, line: str) -> None:
    assert error_line(error) == line


# Modules that complete and deliver cascade's own spooled record as JSON, field by field: a dead
# run's spool is recovered leniently (a typed read that refused a damaged spool would lose the run).
JSON_WRITERS = ("recovery.py", "store/delivery.py", "record_shape.py")
RAW_SECTION = re.compile(
    r"\b(record|manifest|manifest_a|manifest_b|m|a|b|here|earlier|later|original)"
    r"(\.get\(|\[)\"(git|python|torch|hardware|container|data|checkpoints|outcome|inputs|outputs|trace|"
    r"distributed|environment_read)\""
)


def test_no_reader_takes_a_section_of_a_record_as_a_raw_mapping() -> None:
    assert matching_lines(RAW_SECTION, skip=JSON_WRITERS) == []
    sample = 'git = record.get("git") or {}'
    assert RAW_SECTION.search(sample), "the pattern no longer finds a raw read"
