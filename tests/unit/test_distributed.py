"""torchrun jobs on hand-written traces and records: the rank verdict, the layout a rank sees, and
the record's `distributed` section checked as untrusted input (tests/func/test_distributed.py runs
real jobs)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cascade_repro.determinism.verdict import judge_ranks
from cascade_repro.distributed import (
    LAUNCHED,
    Distributed,
    is_launcher_variable,
    joined,
    launched,
    rank_warnings,
)
from cascade_repro.errors import CascadeError, UsageError
from cascade_repro.manifest import check_shape
from tests.plugin import as_record
from tests.unit.test_verdict import _manifest, _record


def _job(run_id: str, world_size: int = 2) -> dict[str, Any]:
    layout = {"launcher": LAUNCHED, "world_size": world_size, "nproc_per_node": world_size, "nnodes": 1}
    return {**_manifest(run_id), "distributed": {**layout, "ranks": []}}


def test_every_rank_equal_is_bitwise_identical_with_each_ranks_verdict() -> None:
    ranks = [[_record(i) for i in range(3)] for _ in range(2)]
    verdict = judge_ranks(as_record(_job("a")), as_record(_job("b")), ranks, copy.deepcopy(ranks))
    assert verdict.verdict == "BITWISE_IDENTICAL"
    assert verdict.summary == "every rank's steps are bitwise identical (2 ranks, 6 steps in all)"
    assert [(r.rank, r.verdict, r.steps) for r in verdict.ranks] == [(0, "BITWISE_IDENTICAL", 3),
                                                                     (1, "BITWISE_IDENTICAL", 3)]  # fmt: skip


def test_the_rank_whose_divergence_comes_first_in_causal_order_is_named() -> None:
    ranks = [[_record(i) for i in range(3)] for _ in range(2)]
    other = copy.deepcopy(ranks)
    other[0][1]["grads"]["w"] = "reduced"  # rank 0: gradients at step 1 (all-reduced from rank 1)
    other[1][1]["batch"] = "skewed"  # rank 1: its batch at step 1, which comes first
    other[1][1]["grads"]["w"] = "reduced"
    verdict = judge_ranks(as_record(_job("a")), as_record(_job("b")), ranks, other)
    assert verdict.verdict == "DIVERGED" and verdict.summary.startswith("rank 1: DIVERGED at step 1")
    assert verdict.comparison.facets()[0] == "batch"
    assert [r.verdict for r in verdict.ranks] == ["DIVERGED", "DIVERGED"]
    other[0][0]["loss"]["bits"] += 1  # now rank 0 differs a step earlier: rank 0 is first
    assert judge_ranks(as_record(_job("a")), as_record(_job("b")), ranks, other).summary.startswith(
        "rank 0: DIVERGED at step 0"
    )


def test_jobs_of_other_sizes_compare_rank_0_only_and_name_the_world_size() -> None:
    trace = [_record(i) for i in range(3)]
    verdict = judge_ranks(
        as_record(_job("a", 2)), as_record(_job("b", 1)), [trace, trace], [copy.deepcopy(trace)]
    )
    assert verdict.verdict == "INCOMPARABLE"
    assert "the other ranks are not compared (2 vs 1 ranks)" in verdict.summary
    assert [d.summary for d in verdict.differences if d.kind == "world_size"] == [
        "world size differs: 2 processes vs 1"
    ]


def test_a_single_process_verdict_is_unchanged() -> None:
    trace = [_record(i) for i in range(3)]
    verdict = judge_ranks(
        as_record(_manifest("a")), as_record(_manifest("b")), [trace], [copy.deepcopy(trace)]
    )
    assert verdict.verdict == "BITWISE_IDENTICAL" and verdict.ranks == ()
    assert verdict.summary == "all 3 steps are bitwise identical"


def test_a_rank_of_the_users_torchrun_finds_its_job() -> None:
    environ = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job/../x"}
    layout = joined(environ)
    assert layout == Distributed("torchrun", 4, 2, 2, rank=1, job="job_.._x", local_rank=1)
    assert not layout.leads_another_node and list(layout.remote_ranks) == []
    assert joined({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: a plain run
    assert joined({"WORLD_SIZE": "2"}) is None and joined({"RANK": "x", "WORLD_SIZE": "2"}) is None
    with pytest.raises(UsageError, match="inside a torchrun job"):
        launched(2, {"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(UsageError, match="from 1 to 256"):
        launched(300, {})


def test_the_first_rank_of_another_node_delivers_that_nodes_ranks() -> None:
    node = {"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "j"}
    second = joined({**node, "RANK": "2", "LOCAL_RANK": "0"})
    assert second is not None and second.nnodes == 3 and second.leads_another_node
    assert (list(second.node_ranks), list(second.local_ranks)) == ([2, 3], [3])
    follower = joined({**node, "RANK": "3", "LOCAL_RANK": "1"})
    assert follower is not None and not follower.leads_another_node and list(follower.node_ranks) == [2, 3]
    rank0 = joined({**node, "RANK": "0", "LOCAL_RANK": "0"})
    assert rank0 is not None and not rank0.leads_another_node
    assert (list(rank0.local_ranks), list(rank0.remote_ranks)) == ([1], [2, 3, 4, 5])
    odd = joined({**node, "RANK": "1", "LOCAL_RANK": "7"})  # a LOCAL_RANK out of its node: from RANK
    assert odd is not None and odd.local_rank == 1


def test_nnodes_options_are_checked_before_anything_starts() -> None:
    from cascade_repro.distributed import nodes_launch

    assert nodes_launch(None, 2, None, {}) is None
    launch = nodes_launch(2, None, "node1", {})
    assert launch is not None
    assert (launch.nnodes, launch.nproc_per_node, launch.endpoint) == (2, 1, "node1:29400")
    refused = ((2, None, "--rdzv-endpoint HOST:PORT"), (0, "h:1", "from 1 to 4096"), (2, "h:x", "HOST:PORT"),
               (2, ":80", "HOST:PORT"), (2, "h:70000", "HOST:PORT"), (None, "h:1", "goes with --nnodes"))
    for nnodes, endpoint, said in refused:
        with pytest.raises(UsageError, match=said):
            nodes_launch(nnodes, None, endpoint, {})
    with pytest.raises(UsageError, match="inside a torchrun job"):
        nodes_launch(2, 1, "h:1", {"RANK": "0", "WORLD_SIZE": "2"})


UNREADABLE = {"rank": 3, "error": None, "exit_code": None, "missing": "its exit.json is not readable"}


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ('{"rank": 3, "exit_code": 0, "error": null, "trace": {"artifact": "../../etc", "steps": 4}}',
         {"rank": 3, "exit_code": 0, "error": None,
          "trace": {"artifact": "cascade/ranks/3/trace.jsonl", "steps": 4}}),
        ('{"rank": 3, "exit_code": true, "error": {"type": 1, "message": "' + "m" * 5000 + '", "x": 2}}',
         {"rank": 3, "exit_code": None, "error": {"type": "1", "message": "m" * 2000}}),
        ('{"rank": 3, "trace": {"steps": -1}}', {"rank": 3, "exit_code": None, "error": None}),
        ('{"rank": 4}', UNREADABLE),
        ("[1]", UNREADABLE),
        ("{", UNREADABLE),
        ("[" * 100_000, UNREADABLE),  # deeper than the parser goes
        ('{"rank": 3, "pad": "' + "x" * (1 << 20) + '"}', UNREADABLE),  # longer than cascade writes
    ],
)
def test_another_nodes_exit_is_read_as_untrusted_input(stored: str, expected: dict[str, Any]) -> None:
    from cascade_repro.node_exchange import remote_entry

    assert remote_entry(3, stored) == expected


def test_a_node_leaves_the_other_nodes_files_in_a_shared_job_directory(tmp_path: Any) -> None:
    from cascade_repro.child.protocol import RUN_ID_FILE, rank_dir
    from cascade_repro.distributed import leave_job_dir

    job = tmp_path / "job"
    for rank in (1, 2, 3):
        rank_dir(job, rank).mkdir(parents=True)
        (rank_dir(job, rank) / "trace.jsonl").write_text("{}\n")
    (job / RUN_ID_FILE).write_text("abc")
    leave_job_dir(job, range(2, 4))  # the second node is done; rank 1's node is not
    assert (rank_dir(job, 1) / "trace.jsonl").exists() and not rank_dir(job, 2).exists()
    leave_job_dir(job, range(1, 2))  # the last to leave removes it
    assert not job.exists()


def test_a_node_range_stops_at_the_world_size() -> None:
    layout = joined({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "j"})
    assert layout is not None and list(layout.node_ranks) == [2]  # no LOCAL_WORLD_SIZE: not 2..4


def test_a_rank_writes_apart_only_in_a_job_of_several() -> None:
    from cascade_repro.child.protocol import process_rank

    assert process_rank({"RANK": "1", "WORLD_SIZE": "2"}) == 1
    assert process_rank({"RANK": "3"}) == 0  # an exported RANK alone is no job: the run dir is rank 0's
    assert process_rank({"RANK": "5", "WORLD_SIZE": "2"}) == 0
    assert process_rank({"RANK": "x", "WORLD_SIZE": "2"}) == 0


def test_torchruns_variables_are_the_jobs_not_causes() -> None:
    assert all(map(is_launcher_variable, ("RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE")))
    assert not any(map(is_launcher_variable, ("OMP_NUM_THREADS", "RANKING", "NCCL_ALGO")))


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("two", "distributed"),
        ({"world_size": "2"}, "distributed.world_size"),
        ({"world_size": 2, "nproc_per_node": 100000}, "distributed.nproc_per_node"),
        ({"world_size": True}, "distributed.world_size"),
        ({"world_size": 2, "ranks": [{"rank": 0}]}, r"distributed.ranks\[0\].rank"),
        ({"world_size": 2, "ranks": [{"rank": 5}]}, r"distributed.ranks\[0\].rank"),
        ({"world_size": 2, "ranks": [{"rank": 1}, {"rank": 1}]}, "distributed.ranks"),
        ({"world_size": 2, "ranks": "all"}, "distributed.ranks"),
    ],
)
def test_a_malformed_distributed_section_is_refused(section: Any, named: str) -> None:
    with pytest.raises(CascadeError, match=f"{named} is"):
        check_shape({**_manifest("a"), "distributed": section}, "a")


def test_a_rank_stopped_by_an_exception_without_a_message_is_named_without_a_colon() -> None:
    ranks = [{"rank": 1, "exit_code": 130, "error": {"type": "KeyboardInterrupt", "message": ""}},
             {"rank": 2, "exit_code": 1, "error": {"type": "RuntimeError", "message": "boom"}}]
    assert rank_warnings({"ranks": ranks}) == [
        "rank 1 exited with code 130: KeyboardInterrupt", "rank 2 exited with code 1: RuntimeError: boom"
    ]
