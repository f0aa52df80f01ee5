"""The child's record of the environment variables a script reads, and how the parent keeps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cascade_repro.capture.environment import environment_read
from cascade_repro.determinism.explain import manifest_differences

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
    (difference,) = manifest_differences(a, b)
    assert difference.klass == "B" and difference.summary.endswith("PERTURB unset → '5'")
