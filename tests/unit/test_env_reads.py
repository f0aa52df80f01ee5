"""The child's record of the environment variables a script reads, and how the parent keeps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cascade_repro.capture.environment import environment_read
from cascade_repro.determinism.explain import manifest_differences
from tests.plugin import as_record

SCRIPT = """
import json, os
from cascade_repro.child import env_reads
names = env_reads.record_reads()
os.environ.get("A_SET"); os.getenv("B_UNSET"); "C_SET" in os.environ; os.environ["D_SET"]
snapshot = dict(os.environ); copied = os.environ.copy()  # bulk copies are not reads
os.environ.get("HOME"); os.environ.get("CASCADE_SEED")  # machine-specific / cascade's own
print(json.dumps(env_reads.values_read(names)))
"""


def test_named_lookups_are_recorded_bulk_copies_and_machine_names_are_not() -> None:
    env = {**os.environ, "A_SET": "1", "C_SET": "3", "D_SET": "4", "E_NEVER_READ": "5"}
    env.pop("B_UNSET", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"A_SET": "1", "B_UNSET": None, "C_SET": "3", "D_SET": "4"}


def test_the_parent_drops_allow_listed_names_and_redacts_secrets() -> None:
    read = {
        "OMP_NUM_THREADS": "2",
        "DATA_DIR": "/d",
        "HF_TOKEN": "hf_x",
        "DB": "postgresql://u:p@h/db",
        "X": None,
    }
    assert environment_read(read, ("OMP_",)) == {
        "DATA_DIR": "/d", "DB": "postgresql://u:<redacted>@h/db", "HF_TOKEN": "<redacted>", "X": None,
    }  # fmt: skip


def test_a_variable_read_with_another_value_is_a_class_b_difference() -> None:
    a = {"environment_read": {"PERTURB": None, "SAME": "1", "ONLY_A": "x"}}
    b = {"environment_read": {"PERTURB": "5", "SAME": "1"}}
    (difference,) = manifest_differences(as_record(a), as_record(b))
    assert difference.klass == "B" and difference.summary.endswith("PERTURB unset → '5'")


def test_a_bytes_key_lookup_from_a_subprocess_is_not_a_read() -> None:
    script = (
        "import json, os, subprocess\n"
        "from cascade_repro.child import env_reads\n"
        "names = env_reads.record_reads()\n"
        "subprocess.run(['true'], check=True)  # os.get_exec_path() tries os.environ[b'PATH']\n"
        "os.environ.get('MY_LR')\n"
        "print(json.dumps(env_reads.values_read(names)))\n"
    )
    env = {**os.environ, "MY_LR": "0.05"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"MY_LR": "0.05"} and out.stderr == ""


def test_a_failing_part_of_the_exit_facts_is_named_and_the_others_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch  # noqa: F401  (loaded, so the exit facts probe its stack)

    from cascade_repro.child import bootstrap

    def broken(names: set[str]) -> dict[str, str | None]:
        raise TypeError("'<' not supported between instances of 'bytes' and 'str'")

    monkeypatch.setattr(bootstrap.env_reads, "values_read", broken)
    facts = bootstrap.Facts(tmp_path / "child.json")
    bootstrap._record_at_exit(facts, {"MY_LR"})
    written = json.loads((tmp_path / "child.json").read_text())
    assert written["errors"] == {"environment_read": "TypeError: '<' not supported between instances of "
                                 "'bytes' and 'str'"}  # fmt: skip
    assert "environment_read" not in written and written["ended_at"]
    assert written["torch"]["version"] and "num_threads" in written["torch"]
