"""Multi-node torchrun (issue 15): `cascade run --nnodes 2 ... --rdzv-endpoint HOST:PORT` on each node,
one cascade run for the job on the shared tracking server, every rank's trace in it, restored rank by
rank. Two "nodes" on localhost: two clones in directories of their own (each its own `.cascade/`, DVC
cache and no shared files), one c10d rendezvous, gloo on CPU, a real `mlflow server`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.plugin import CASCADE, SCRIPTS, Project, git
from tests.server.conftest import free_port

pytestmark = pytest.mark.slow
pytest.importorskip("torch.distributed.run", reason="torchrun comes with torch")

STEPS = 4


def _trace(client: object, run_id: str, artifact: str, into: Path) -> list[dict]:
    local = client.download_artifacts(run_id, artifact, str(into))  # type: ignore[attr-defined]
    return [json.loads(line) for line in Path(local).read_text().splitlines() if line.strip()]


def _two_nodes(project: Project, clone: Path, url: str, *options: str,
               env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:  # fmt: skip
    """The same `cascade run --nnodes 2` started on both "machines" at once; both must end."""
    endpoint = f"127.0.0.1:{free_port()}"
    argv = [*CASCADE, "run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, *options,
            "train_ddp.py", "--steps", str(STEPS)]  # fmt: skip
    environ = {**os.environ, "MLFLOW_TRACKING_URI": url, **(env or {})}
    started = [subprocess.Popen(argv, cwd=where, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for where in (project.root, clone)]  # fmt: skip
    ended = []
    for process in started:
        out, err = process.communicate(timeout=600)
        ended.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return ended


@pytest.fixture
def two_machines(project: Project, tmp_path: Path) -> tuple[Project, Path]:
    project.write("train_ddp.py", (SCRIPTS / "frameworks" / "train_ddp.py").read_text())
    project.commit("a DDP script")
    clone = tmp_path / "machine-b"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    return project, clone


def test_two_nodes_are_one_run_with_every_ranks_trace_on_the_server_and_restore_rank_by_rank(
    two_machines: tuple[Project, Path], tracking_server: tuple[str, Path], tmp_path: Path
) -> None:
    project, clone = two_machines
    url, artifacts = tracking_server
    # every step's weights and gradients read (not as the budget allows), to compare them rank by rank
    for ended in _two_nodes(project, clone, url, "--tag", "v1", "--trace-budget", "0"):
        assert ended.returncode == 0, ended.stderr[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url)
    (experiment,) = [e for e in client.search_experiments() if e.name == "proj"]
    (run,) = client.search_runs([experiment.experiment_id])  # one run for the job, not one per node
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.data.tags["cascade.version"] == "v1"
    into = tmp_path / "downloaded"
    record = json.loads(Path(client.download_artifacts(run_id, "cascade/run.json", str(into))).read_text())
    assert record["git"]["commit"] == git(project.root, "rev-parse", "HEAD").strip()
    layout = record["distributed"]
    assert (layout["world_size"], layout["nproc_per_node"], layout["nnodes"]) == (2, 1, 2)
    (rank1,) = layout["ranks"]
    assert rank1["rank"] == 1 and rank1["exit_code"] == 0 and rank1["error"] is None
    assert rank1["trace"] == {"artifact": "cascade/ranks/1/trace.jsonl", "steps": STEPS}
    stored = {Path(p).relative_to(artifacts).as_posix() for p in artifacts.rglob("*") if p.is_file()}
    assert any(p.endswith(f"{run_id}/artifacts/cascade/ranks/1/trace.jsonl") for p in stored), stored
    rank0 = _trace(client, run_id, "cascade/trace.jsonl", into)
    other = _trace(client, run_id, "cascade/ranks/1/trace.jsonl", into)
    assert len(rank0) == len(other) == record["trace"]["steps"] == STEPS
    # Each node traced its own rank's shard of one model: DDP all-reduced the gradients across nodes.
    for a, b in zip(rank0, other, strict=True):
        assert a["batch"] != b["batch"] and (a["grads"], a["params_after"]) == (b["grads"], b["params_after"])
    for where in (project.root, clone):  # each node's job directory went once its ranks were delivered
        assert not list((where / ".cascade" / "jobs").glob("*/ranks/*/trace.jsonl"))

    # Restored on one machine (either clone): every rank started here, compared rank by rank.
    restored = Project(clone).cascade("restore", "v1", "--json", env={"MLFLOW_TRACKING_URI": url},
                                      timeout=600)  # fmt: skip
    assert restored.returncode == 0, restored.stderr[-3000:]
    verdict = json.loads(restored.stdout)["data"]["verdict"]
    assert verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]
    assert [(r["rank"], r["verdict"], r["steps"]) for r in verdict["ranks"]] == [
        (0, "BITWISE_IDENTICAL", STEPS), (1, "BITWISE_IDENTICAL", STEPS),
    ]  # fmt: skip
    (nodes,) = [d for d in verdict["record_differences"] if d["kind"] == "nnodes"]
    assert nodes["class"] == "A" and nodes["summary"] == "node count differs: 2 nodes vs 1"


def test_a_failing_rank_on_the_other_node_fails_the_job_and_is_named(
    two_machines: tuple[Project, Path], tracking_server: tuple[str, Path]
) -> None:
    project, clone = two_machines
    url, _ = tracking_server
    ended = _two_nodes(project, clone, url, env={"DDP_FAIL_RANK": "1"})
    assert all(e.returncode != 0 for e in ended), [e.returncode for e in ended]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url)
    (experiment,) = [e for e in client.search_experiments() if e.name == "proj"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED"
    # the node of rank 0 (the rendezvous decides which) prints the run and how rank 1 ended
    (rank0_says,) = [e.stderr for e in ended if "see it: cascade show" in e.stderr]
    said = "rank 1 exited with code 1: RuntimeError: rank 1 gave up at step 1"
    assert said in rank0_says, rank0_says[-3000:]


def test_nnodes_refusals_name_the_fix(project: Project) -> None:
    project.write("train_ddp.py", (SCRIPTS / "frameworks" / "train_ddp.py").read_text())
    project.commit("a DDP script")
    no_endpoint = project.cascade("run", "--nnodes", "2", "train_ddp.py")
    assert no_endpoint.returncode == 2 and "--rdzv-endpoint" in no_endpoint.stderr
    bad = project.cascade("run", "--nnodes", "0", "--rdzv-endpoint", "h:1", "train_ddp.py")
    assert bad.returncode == 2 and "--nnodes must be from 1" in bad.stderr
    endpoint = project.cascade("run", "--nnodes", "2", "--rdzv-endpoint", "h:notaport", "train_ddp.py")
    assert endpoint.returncode == 2 and "HOST:PORT" in endpoint.stderr
    two_nodes = ("run", "--nnodes", "2", "--rdzv-endpoint", "h:1")
    seeded = project.cascade(*two_nodes, "--seed", "random", "train_ddp.py")
    assert seeded.returncode == 2 and "--seed N" in seeded.stderr
    assert project.runs() == []
