"""`--deterministic off|warn|strict` on a real script that uses an op torch calls nondeterministic.

`max_unpool2d` raises torch's nondeterminism alert on CPU in torch 2.x, the same alert CUDA ops
such as `index_add_` raise on a GPU, so the recording and the strict refusal are exercised here.
"""

from __future__ import annotations

import pytest

from tests.plugin import SCRIPTS, Project

pytestmark = pytest.mark.slow

OP = "max_unpooling2d_forward_out"


@pytest.fixture
def unpool(project: Project) -> Project:
    project.write("unpool.py", (SCRIPTS / "unpool.py").read_text())
    project.commit("unpool")
    return project


def test_warn_records_the_op_and_the_flags_in_force(unpool: Project) -> None:
    run_id = unpool.record("unpool.py")  # warn is the default
    determinism = unpool.manifest(run_id)["determinism"]
    assert determinism["mode"] == "warn"
    assert determinism["nondeterministic_ops"] == [OP]
    assert "stopped_by" not in determinism
    flags = determinism["flags_at_start"]
    assert flags["deterministic_algorithms"] is True and flags["deterministic_warn_only"] is True
    assert flags["cudnn.deterministic"] is True and flags["cudnn.benchmark"] is False
    assert unpool.manifest(run_id)["trace"]["steps"] == 5


def test_strict_stops_the_script_names_the_op_and_keeps_the_run(unpool: Project) -> None:
    result = unpool.cascade("run", "--deterministic", "strict", "unpool.py")
    assert result.returncode != 0
    assert f"torch has no deterministic implementation of {OP}" in result.stderr
    assert "--deterministic warn" in result.stderr
    run = unpool.only_run()
    assert run.info.status == "FAILED"
    manifest = unpool.manifest(run.info.run_id)
    determinism = manifest["determinism"]
    assert determinism["mode"] == "strict"
    assert determinism["stopped_by"] == OP and determinism["nondeterministic_ops"] == [OP]
    assert determinism["flags_at_start"]["deterministic_warn_only"] is False
    assert manifest["outcome"]["error"]["type"] == "RuntimeError"


def test_off_records_the_flags_and_no_ops(unpool: Project) -> None:
    run_id = unpool.record("--deterministic", "off", "unpool.py")
    determinism = unpool.manifest(run_id)["determinism"]
    assert determinism["mode"] == "off"
    assert "nondeterministic_ops" not in determinism
    assert determinism["flags_at_start"]["deterministic_algorithms"] is False
