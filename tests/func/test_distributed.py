"""torchrun jobs (issue 14, multi-process training): one cascade run per job, every rank's trace in
it, verify and restore rank by rank. A plain DDP script (tests/func/scripts/frameworks/train_ddp.py),
2 ranks, gloo on CPU, real torchrun."""

from __future__ import annotations

import json
import sys

import pytest

from tests.plugin import SCRIPTS, Project

pytest.importorskip("torch.distributed.run", reason="torchrun comes with torch")

STEPS = 4


def _ddp_project(project: Project) -> Project:
    project.write("train_ddp.py", (SCRIPTS / "frameworks" / "train_ddp.py").read_text())
    project.commit("a DDP script")
    return project


def _trace(project: Project, run_id: str, artifact: str) -> list[dict]:
    text = (project.root / "mlruns").glob(f"*/{run_id}/artifacts/{artifact}")
    (path,) = list(text) or list((project.root / "mlruns").glob(f"{run_id}/artifacts/{artifact}"))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _verify(project: Project, a: str, b: str) -> dict:
    result = project.cascade("verify", a, b, "--json")
    return json.loads(result.stdout)["data"]


def test_nproc_per_node_is_one_run_with_every_ranks_trace_and_restores_rank_by_rank(project: Project) -> None:
    _ddp_project(project)
    # every step's weights and gradients read (not as the budget allows), to compare them rank by rank
    every_step = ("--trace-budget", "0")
    first = project.record("--nproc-per-node", "2", *every_step, "train_ddp.py", "--steps", str(STEPS))
    assert len(project.runs()) == 1  # one run for the job, not one per rank
    manifest = project.manifest(first)
    layout = manifest["distributed"]
    assert (layout["launcher"], layout["world_size"], layout["nproc_per_node"], layout["nnodes"]) == (
        "cascade", 2, 2, 1,
    )  # fmt: skip
    assert [r["rank"] for r in layout["ranks"]] == [1] and layout["ranks"][0]["error"] is None
    assert layout["ranks"][0]["trace"] == {"artifact": "cascade/ranks/1/trace.jsonl", "steps": STEPS}
    rank0 = _trace(project, first, "cascade/trace.jsonl")
    rank1 = _trace(project, first, "cascade/ranks/1/trace.jsonl")
    assert len(rank0) == len(rank1) == manifest["trace"]["steps"] == STEPS
    # Each rank traced its own shard (other batches, losses) of one model: DDP all-reduces the
    # gradients, so both ranks' gradients and weights are equal.
    for a, b in zip(rank0, rank1, strict=True):
        assert a["batch"] and a["batch"] != b["batch"] and a["loss"] != b["loss"]
        assert (a["grads"], a["params_after"]) == (b["grads"], b["params_after"])

    second = project.record("--nproc-per-node", "2", "train_ddp.py", "--steps", str(STEPS))
    verdict = _verify(project, first, second)
    assert verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]
    assert [(r["rank"], r["verdict"], r["steps"]) for r in verdict["ranks"]] == [
        (0, "BITWISE_IDENTICAL", STEPS), (1, "BITWISE_IDENTICAL", STEPS),
    ]  # fmt: skip
    assert not verdict["record_differences"]  # torchrun's MASTER_PORT and the like are not causes

    project.cascade("tag", first, "v1.0.0", check=True)
    restored = project.cascade("restore", "v1.0.0")
    assert restored.returncode == 0, restored.stderr
    assert "BITWISE_IDENTICAL" in restored.stdout and "rank 1: BITWISE_IDENTICAL" in restored.stdout
    rerun = next(r.info.run_id for r in project.runs() if r.info.run_id not in (first, second))
    assert project.manifest(rerun)["distributed"]["world_size"] == 2


def test_a_divergence_on_one_rank_is_named_with_that_rank(project: Project) -> None:
    _ddp_project(project)
    base = project.record("--nproc-per-node", "2", "train_ddp.py", "--steps", str(STEPS))
    skewed = project.record("--nproc-per-node", "2", "train_ddp.py", "--steps", str(STEPS),
                            env={"DDP_SKEW": "0.5"})  # fmt: skip
    verdict = _verify(project, base, skewed)
    assert verdict["verdict"] == "DIVERGED"
    # Rank 0's gradients differ at step 0 too (all-reduced), but rank 1's batch came first.
    assert verdict["summary"].startswith("rank 1: DIVERGED at step 0"), verdict["summary"]
    assert verdict["first_divergence"]["facets"][0]["facet"] == "batch"
    by_rank = {r["rank"]: r for r in verdict["ranks"]}
    assert by_rank[0]["verdict"] == by_rank[1]["verdict"] == "DIVERGED"
    assert "DDP_SKEW" in verdict["likely_causes"][0]["summary"]


def test_the_users_own_torchrun_with_cascade_in_each_rank_is_one_run(project: Project) -> None:
    _ddp_project(project)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    import subprocess

    launched = subprocess.run(
        [*torchrun, "-m", "cascade_repro.cli", "run", "train_ddp.py", "--steps", str(STEPS)],
        cwd=project.root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    (run,) = project.runs()  # rank 1's `cascade run` joined rank 0's
    manifest = project.manifest(run.info.run_id)
    layout = manifest["distributed"]
    assert (layout["launcher"], layout["world_size"]) == ("torchrun", 2)
    trace = {"artifact": "cascade/ranks/1/trace.jsonl", "steps": STEPS}
    assert layout["ranks"] == [{"rank": 1, "error": None, "exit_code": 0, "trace": trace}]
    assert len(_trace(project, run.info.run_id, "cascade/ranks/1/trace.jsonl")) == STEPS
    assert "rank 1: the script ended (exit 0)" in launched.stderr
    assert not list((project.root / ".cascade" / "jobs").iterdir())  # the job directory is gone
    # The same job started by cascade's own torchrun is the same training, bit for bit.
    ours = project.record("--nproc-per-node", "2", "train_ddp.py", "--steps", str(STEPS))
    verdict = _verify(project, run.info.run_id, ours)
    assert verdict["verdict"] == "BITWISE_IDENTICAL", verdict
    assert not [d for d in verdict["record_differences"] if d["kind"] == "environment"]


def test_another_world_size_is_a_class_a_cause(project: Project) -> None:
    _ddp_project(project)
    two = project.record("--nproc-per-node", "2", "train_ddp.py", "--steps", str(STEPS))
    one = project.record("--nproc-per-node", "1", "train_ddp.py", "--steps", str(STEPS))
    verdict = _verify(project, two, one)
    assert verdict["verdict"] != "BITWISE_IDENTICAL"
    (size,) = [d for d in verdict["record_differences"] if d["kind"] == "world_size"]
    assert size == {"kind": "world_size", "class": "A", "summary": "world size differs: 2 processes vs 1"}
    fixes = [c["fix"] for c in verdict["likely_causes"]]
    assert any("--nproc-per-node 2" in fix for fix in fixes), fixes
    shown = project.cascade("diff", two, one, "--json")
    stack = json.loads(shown.stdout)["data"]
    assert "world_size" in json.dumps(stack)


def test_nproc_per_node_refusals_name_the_fix(project: Project) -> None:
    _ddp_project(project)
    zero = project.cascade("run", "--nproc-per-node", "0", "train_ddp.py")
    assert zero.returncode == 2 and "--nproc-per-node must be from 1 to 256" in zero.stderr
    inside = project.cascade("run", "--nproc-per-node", "2", "train_ddp.py",
                             env={"RANK": "0", "WORLD_SIZE": "2"})  # fmt: skip
    assert inside.returncode == 2 and "inside a torchrun job" in inside.stderr
    assert project.runs() == []


def test_a_rank_that_fails_fails_the_run_and_is_named(project: Project) -> None:
    _ddp_project(project)
    failed = project.cascade("run", "--nproc-per-node", "2", "train_ddp.py", "--steps", str(STEPS),
                             env={"DDP_FAIL_RANK": "1"})  # fmt: skip
    assert failed.returncode == 1  # rank 1's own exit code, not torchrun's summary
    assert "rank 1 failed: RuntimeError: rank 1 gave up at step 1" in failed.stderr
    (run,) = project.runs()
    assert run.info.status == "FAILED"
    manifest = project.manifest(run.info.run_id)
    (rank1,) = manifest["distributed"]["ranks"]
    assert rank1["error"] == {"type": "RuntimeError", "message": "rank 1 gave up at step 1"}
    assert rank1["trace"]["steps"] == 2  # steps 0 and 1, then it raised
    assert len(_trace(project, run.info.run_id, "cascade/ranks/1/trace.jsonl")) == 2


def test_a_module_run_by_name_under_torchrun_is_the_same_training(project: Project) -> None:
    """`cascade run --nproc-per-node 2 -m jobs.train_ddp`: every rank runs the module by its name."""
    _ddp_project(project)
    project.write("jobs/__init__.py", "")
    project.write("jobs/train_ddp.py", (SCRIPTS / "frameworks" / "train_ddp.py").read_text())
    project.commit("the DDP script as a module")

    by_name = project.record("--nproc-per-node", "2", "-m", "jobs.train_ddp", "--steps", str(STEPS))

    manifest = project.manifest(by_name)
    command = manifest["command"]
    assert (command["module"], command["script"]) == ("jobs.train_ddp", "jobs/train_ddp.py")
    assert manifest["distributed"]["ranks"][0]["trace"]["steps"] == manifest["trace"]["steps"] == STEPS
    as_script = project.record("--nproc-per-node", "2", "train_ddp.py", "--steps", str(STEPS))
    verdict = _verify(project, by_name, as_script)
    assert verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]
