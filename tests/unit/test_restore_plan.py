"""Restore's plan from an untrusted record: path checks, environment, machine differences; versions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cascade_repro.errors import CascadeError, UnsafeRecord, UsageError
from cascade_repro.restore import machine_differences, plan_restore, recorded_environment
from cascade_repro.versions import validate_version
from tests.plugin import as_record

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _record(**git: Any) -> dict[str, Any]:
    return {
        "run_id": "r" * 32,
        "experiment": "exp",
        "command": {"script": "src/train.py", "argv": ["--epochs", "3"], "cwd": "."},
        "params": {"values": {"lr": 0.1}, "seed": 7},
        "determinism": {"mode": "strict"},
        "git": {"commit": COMMIT, "dirty": True, "untracked": [], **git},
        "trace": {"interval": 1, "steps": 10},
        "environment": {"OMP_NUM_THREADS": "2", "HF_TOKEN": "<redacted>", "MLFLOW_RUN_ID": "x"},
    }


def _plan(record: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    return plan_restore(
        as_record(record),
        "v1",
        Path("/tmp/w"),
        None,
        environ or {},
        ("OMP_", "HF_", "MLFLOW_"),
        as_record({}),
    )


def test_plan_carries_the_recorded_command_seed_and_mode() -> None:
    plan = _plan(_record(untracked=[{"path": "a/b.txt", "sha256": "0", "stored": True}]))
    assert (plan.script, plan.argv, plan.cwd, plan.seed, plan.determinism) == (
        "src/train.py", ("--epochs", "3"), ".", 7, "strict",
    )  # fmt: skip
    assert [u.path for u in plan.untracked] == ["a/b.txt"] and plan.unavailable == ()


@pytest.mark.parametrize(
    "path", ["../x", "a/../../x", "/etc/passwd", ".git/hooks/post-checkout", "", "a\\..\\x", "./.."]
)
def test_paths_escaping_the_worktree_are_refused(path: str) -> None:
    with pytest.raises(UnsafeRecord, match="escapes the worktree"):
        _plan(_record(untracked=[{"path": path, "sha256": "0", "stored": True}]))


def test_a_script_outside_the_worktree_is_refused() -> None:
    record = _record()
    record["command"]["script"] = "../../bin/evil.py"
    with pytest.raises(UnsafeRecord, match="the script"):
        _plan(record)


@pytest.mark.parametrize("target", ["/etc/shadow", "../../outside", "a/../../.."])
def test_symlinks_pointing_out_are_refused(target: str) -> None:
    item = {"path": "link", "sha256": "0", "stored": True, "symlink_target": target}
    with pytest.raises(UnsafeRecord, match="points outside"):
        _plan(_record(untracked=[item]))


def test_symlinks_within_the_worktree_are_kept() -> None:
    item = {"path": "d/link", "sha256": "0", "stored": True, "symlink_target": "../data/x"}
    assert len(_plan(_record(untracked=[item])).untracked) == 1


def test_a_record_without_a_full_commit_is_refused() -> None:
    with pytest.raises(CascadeError, match="the run record is malformed: git.commit is str 'abc123'"):
        _plan(_record(commit="abc123"))


def test_a_run_killed_before_its_code_was_recorded_is_refused_saying_so() -> None:
    """Found by `kill -9` of `cascade` seconds after its start: `restore` said "records no usable git
    commit ('')", as for a record altered by hand."""
    record = {**_record(commit=None), "outcome": {"status": "KILLED", "exit_code": None}}
    with pytest.raises(CascadeError) as refused:
        _plan(record)
    assert "was KILLED before cascade recorded its code" in refused.value.message
    assert refused.value.hint is not None and "cascade show" in refused.value.hint


def test_recorded_environment_sets_unsets_and_never_touches_the_store_or_secrets() -> None:
    recorded = {"OMP_NUM_THREADS": "2", "HF_TOKEN": "<redacted>", "MLFLOW_RUN_ID": "x", "PYTHONHASHSEED": "3"}
    here = {"OMP_NUM_THREADS": "8", "OMP_PROC_BIND": "true", "HF_TOKEN": "secret", "MLFLOW_TRACKING_URI": "u"}
    changes = recorded_environment(recorded, here, ("OMP_", "HF_", "MLFLOW_", "PYTHONHASHSEED"))
    assert changes == {"OMP_NUM_THREADS": "2", "OMP_PROC_BIND": None}


def test_machine_differences_name_class_a_and_b() -> None:
    record = {
        "torch": {"version": "2.13.0+cpu"},
        "hardware": {"cpu": {"model": "x86_64"}, "gpus": []},
        "python": {"version": "3.11.7"},
        "environment": {"OMP_NUM_THREADS": "2"},
    }
    here = {
        "torch": {"version": "2.14.0+cpu"},
        "hardware": {"cpu": {"model": "x86_64"}, "gpus": [{"name": "NVIDIA H200"}]},
        "python": {"version": "3.11.7"},
        "environment": {},
    }
    found = {(d.kind, d.klass) for d in machine_differences(as_record(record), as_record(here))}
    assert found == {("torch", "A"), ("gpu", "A"), ("environment", "B")}
    assert machine_differences(as_record(record), as_record(record)) == []


@pytest.mark.parametrize("version", ["v1.2.3", "baseline-2026-12", "team/exp_7"])
def test_valid_versions(version: str, tmp_path: Path) -> None:
    validate_version(version, tmp_path)


@pytest.mark.parametrize("version", ["", "has space", "a..b", "v1~", "x" * 101, "0" * 32, "end."])
def test_invalid_versions_are_usage_errors(version: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="invalid version"):
        validate_version(version, tmp_path)


def test_a_record_never_sets_a_variable_that_loads_code_or_that_no_run_records() -> None:
    """A record from a shared server set for the re-run whatever it named beyond a short list: libcuda's
    injection library, git's config (core.fsmonitor runs a command at the script's `git status`), the
    shell's BASH_ENV, NCCL's and OpenMP's plugins, compiled-kernel caches. Only what an honest run
    records is set (its allow-listed variables, and those the script read but for the machine's and
    the interpreter's own), never a variable that loads code."""
    hostile = {
        "CUDA_INJECTION64_PATH": "/x/e.so", "NCCL_NET_PLUGIN": "/x/n.so", "OMP_TOOL_LIBRARIES": "/x/t.so",
        "TORCH_EXTENSIONS_DIR": "/x/ext", "TORCHINDUCTOR_CACHE_DIR": "/x/ind", "TRITON_CACHE_DIR": "/x/tri",
        "LD_AUDIT": "/x/a.so", "DYLD_INSERT_LIBRARIES": "/x/d.dylib", "GLIBC_TUNABLES": "x",
    }  # fmt: skip
    read = {
        "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "touch /x/ran",
        "BASH_ENV": "/x/rc", "ENV": "/x/rc", "PYTHONWARNINGS": "ignore::evil.W", "PERL5OPT": "-Mevil",
        "NODE_OPTIONS": "--require /x/e.js", "GCONV_PATH": "/x", "PATH": "/x/bin", "HOME": "/x",
        "LR": "0.1",  # an honest read: set
    }  # fmt: skip
    allowed = ("CUDA_", "NCCL_", "OMP_", "TORCH", "LD_PRELOAD", "KMP_")
    changes = recorded_environment({**hostile, "OMP_NUM_THREADS": "2"}, {}, allowed, read)
    assert changes == {"OMP_NUM_THREADS": "2", "LR": "0.1"}
    # a recorded variable outside this machine's allow-list is not set either (no run here records it)
    assert recorded_environment({"SOMETHING": "1"}, {}, allowed) == {}


def test_one_worktree_is_held_by_one_restore_however_its_path_is_spelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock was keyed by the path as typed: `--workdir ../w` from a subdirectory, the absolute
    path, or a symlink to it were three locks on one worktree."""
    from cascade_repro.api.restoring import _only_restore_of
    from cascade_repro.settings import load_settings

    settings = load_settings(tmp_path, {})
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "sub")
    monkeypatch.chdir(tmp_path / "sub")
    spellings = [Path("../w").absolute(), tmp_path / "w", tmp_path / "link" / ".." / "w"]
    said: list[str] = []
    with _only_restore_of(spellings[0], settings, said.append):
        for other in spellings[1:]:
            with pytest.raises(CascadeError, match="another cascade restore is using"), \
                    _only_restore_of(other, settings, said.append):  # fmt: skip
                pass
    assert not said  # a restore that runs: refused at once, nothing waited for


def test_a_killed_restores_rerun_that_does_not_stop_is_waited_for_then_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run directory in the worktree whose child (the re-run) still runs, its restore gone: waited
    for, then refused naming it; a pid now someone else's (another start time) is not waited for."""
    import json
    import socket
    import subprocess
    import sys

    from cascade_repro.api import restoring
    from cascade_repro.store.spool import proc_stat

    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)  # fmt: skip
    rerun = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stat = proc_stat(rerun.pid)
        assert stat is not None
        run_dir = tmp_path / "w" / ".cascade" / "runs" / "r1"
        run_dir.mkdir(parents=True)
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()  # (this machine, since boot)
        owner = {"pid": gone, "start_ticks": None, "child_pid": rerun.pid, "child_start_ticks": stat[1],
                 "host": socket.gethostname(), "boot_id": boot_id}  # fmt: skip
        (run_dir / "parent.json").write_text(json.dumps(owner))
        monkeypatch.setattr(restoring, "KILLED_RERUN_WAIT_S", 0.5)
        said: list[str] = []
        with pytest.raises(CascadeError, match=f"still runs in {tmp_path / 'w'} \\(pid {rerun.pid}\\)"):
            restoring._no_rerun_left_in(tmp_path / "w", said.append)
        assert said == [f"waiting for the re-run of an earlier cascade restore (pid {rerun.pid}) to stop: it "
                        "still runs in the worktree"]  # fmt: skip
        (run_dir / "parent.json").write_text(json.dumps({**owner, "child_start_ticks": stat[1] - 1}))
        said.clear()
        restoring._no_rerun_left_in(tmp_path / "w", said.append)  # another process under that pid
        assert not said
    finally:
        rerun.kill()
        rerun.wait()


def test_a_restore_leaves_pythonpath_as_this_shell_has_it() -> None:
    """Recorded (where packages outside the environment came from), never set from a record (it loads
    code), and never unset where the record has none: the re-run imports as this shell does."""
    allowed = ("TORCH", "PYTHONPATH")
    assert recorded_environment({"PYTHONPATH": "/elsewhere"}, {"PYTHONPATH": "/here"}, allowed) == {}
    here = {"PYTHONPATH": "/here", "TORCH_HOME": "/t"}
    assert recorded_environment({}, here, allowed) == {"TORCH_HOME": None}


@pytest.mark.parametrize("writer", ["../../etc/passwd", "`rm -rf ~`", "0" * 31, 7])
def test_an_input_naming_its_writer_with_anything_but_a_run_id_is_refused(writer: Any) -> None:
    """`written_by` is printed in a hint that names a command to run: only a run id is taken."""
    read = {"path": "model.pt", "size": 3, "sha256": "a" * 64, "written_by": writer}
    record = {**_record(), "inputs": [read]}
    with pytest.raises(CascadeError, match=r"inputs\[0\]\.written_by"):
        _plan(record)
