"""Hostile run records: symlinks in the patch or the untracked files, plus data or checkpoint entries
that would be written through them. Every attack must be refused with 0 bytes written outside.

The attacker controls the record and every artifact (a shared server), so each attack edits run.json,
the patch and its sha256 together, as someone with write access to the store would.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import pytest

from tests.plugin import SCRIPTS, Project, git

pytestmark = pytest.mark.slow
DVC = [sys.executable, "-m", "dvc"]
PAYLOAD = bytes(range(256)) * 390 + bytes(160)  # 100,000 bytes, the size the attacks wrote outside


def _bytes_under(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _artifact_dir(project: Project, run_id: str) -> Path:
    return Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path)


def _symlink_patch(project: Project, link: str, target: str) -> bytes:
    """A binary git patch that creates the symlink `link` → `target`, made by git itself."""
    scratch = project.root.parent / "scratch"
    if not scratch.exists():
        subprocess.run(["git", "clone", "-q", str(project.root), str(scratch)], check=True)
    os.symlink(target, scratch / link)
    git(scratch, "add", link)
    patch = subprocess.run(["git", "diff", "--cached", "--binary"], cwd=scratch, check=True,
                           capture_output=True).stdout  # fmt: skip
    git(scratch, "reset", "-q", "--hard")
    return patch


@pytest.fixture
def attacked(project: Project, tmp_path: Path) -> dict[str, Any]:
    """A run that read 100,000 bytes of DVC data and kept checkpoints, tagged v1; its record editable."""
    project.write("ckpt.py", (SCRIPTS / "ckpt.py").read_text())
    project.cascade("init", check=True)
    project.write("data/input.bin", PAYLOAD)
    subprocess.run([*DVC, "add", "-q", "data/input.bin"], cwd=project.root, check=True)
    project.commit("track data")
    run_id = project.record("--tag", "v1", "ckpt.py")
    artifacts = _artifact_dir(project, run_id) / "cascade"
    record = json.loads((artifacts / "run.json").read_text())
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    return {"project": project, "artifacts": artifacts, "record": record, "outside": outside}


def _data_entry(record: dict[str, Any], path: str) -> dict[str, Any]:
    return {**record["data"][0], "path": path}


def _checkpoint_entry(record: dict[str, Any], path: str) -> dict[str, Any]:
    kept = next(c for c in record["checkpoints"] if c["status"] == "kept")
    return {**kept, "path": path}


def _with_patch(attack: dict[str, Any], patch: bytes) -> dict[str, Any]:
    (attack["artifacts"] / "git.patch").write_bytes(patch)
    record = json.loads(json.dumps(attack["record"]))
    record["git"]["dirty"] = True
    record["git"]["patch"] = {"artifact": "cascade/git.patch", "sha256": hashlib.sha256(patch).hexdigest()}
    return record


def _chain(record: dict[str, Any]) -> dict[str, Any]:
    """`p/q/r/s/a` → the worktree's root, then `p/q/r/s/a/l` (really `l`) → four levels above it:
    each target checked as text alone stays inside."""
    record = json.loads(json.dumps(record))
    for path, target in (("p/q/r/s/a", "../../../.."), ("p/q/r/s/a/l", "../../../..")):
        record["git"]["untracked"].append(
            {
                "path": path,
                "size": len(target),
                "sha256": hashlib.sha256(target.encode()).hexdigest(),
                "stored": True,
                "symlink_target": target,
            }  # fmt: skip
        )
    return record


# The worktree is <tmp>/proj/.cascade/restore/v1: four levels up from it is <tmp>, where outside/ is.
ATTACKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "patch symlink + data": lambda a: {
        **(r := _with_patch(a, _symlink_patch(a["project"], "evil", str(a["outside"] / "dir")))),
        "data": [_data_entry(r, "evil/payload.bin")],
    },
    "patch symlink + checkpoint": lambda a: {
        **(r := _with_patch(a, _symlink_patch(a["project"], "evil", str(a["outside"] / "dir")))),
        "checkpoints": [_checkpoint_entry(r, "evil/ckpt.pt")],
    },
    "relative patch symlink + data": lambda a: {
        **(r := _with_patch(a, _symlink_patch(a["project"], "evil", "../../../../outside/dir"))),
        "data": [_data_entry(r, "evil/payload.bin")],
    },
    "untracked symlink chain + data": lambda a: {
        **(r := _chain(a["record"])),
        "data": [_data_entry(r, "p/q/r/s/a/l/outside/dir/payload.bin")],
    },
    "untracked symlink chain + checkpoint": lambda a: {
        **(r := _chain(a["record"])),
        "checkpoints": [_checkpoint_entry(r, "p/q/r/s/a/l/outside/dir/ckpt.pt")],
    },
    "untracked symlink chain + input": lambda a: {  # issue 14.6: an input restore copies in
        **_chain(a["record"]),
        "inputs": [
            {
                "path": "p/q/r/s/a/l/outside/dir/payload.bin",
                "size": 3,
                "sha256": hashlib.sha256(b"abc").hexdigest(),
            }
        ],
    },  # fmt: skip
    "untracked file under a patch symlink": lambda a: {
        **(r := _with_patch(a, _symlink_patch(a["project"], "evil", str(a["outside"] / "dir")))),
        "git": {
            **r["git"],
            "untracked": [
                {
                    "path": "evil/u.txt",
                    "size": 3,
                    "stored": True,
                    "sha256": hashlib.sha256(b"abc").hexdigest(),
                }
            ],
        },  # fmt: skip
    },
}


@pytest.mark.parametrize("no_run", [True, False], ids=["--no-run", "run"])
@pytest.mark.parametrize("name", list(ATTACKS))
def test_symlink_attacks_are_refused_with_nothing_written_outside(
    attacked: dict[str, Any], name: str, no_run: bool
) -> None:
    project, outside = attacked["project"], attacked["outside"]
    record = ATTACKS[name](attacked)
    (attacked["artifacts"] / "run.json").write_text(json.dumps(record))
    if name.startswith("untracked file"):
        (attacked["artifacts"] / "untracked" / "evil").mkdir(parents=True, exist_ok=True)
        (attacked["artifacts"] / "untracked" / "evil" / "u.txt").write_bytes(b"abc")
    result = project.cascade("restore", "v1", *(["--no-run"] if no_run else []))
    assert _bytes_under(outside) == 0, f"{name}: wrote outside the worktree"
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "unsafe record" in result.stderr and "nothing was written" in result.stderr, result.stderr
    assert not (project.root / ".cascade" / "restore" / "v1").exists()
    assert len(git(project.root, "worktree", "list").splitlines()) == 1


def test_a_committed_symlink_pointing_out_is_never_written_through(attacked: dict[str, Any]) -> None:
    """The commit itself (not the record) holds `evil` → outside; the record's data entry under it is
    caught when it is written, by its real path, and the half-made worktree is removed."""
    project, outside = attacked["project"], attacked["outside"]
    os.symlink(str(outside / "dir"), project.root / "evil")
    commit = project.commit("a link out")
    record = json.loads(json.dumps(attacked["record"]))
    record["git"]["commit"] = commit
    record["data"] = [_data_entry(record, "evil/payload.bin")]
    (attacked["artifacts"] / "run.json").write_text(json.dumps(record))
    result = project.cascade("restore", "v1", "--no-run")
    assert _bytes_under(outside) == 0
    assert result.returncode == 1 and "outside" in result.stderr, result.stderr
    assert not (project.root / ".cascade" / "restore" / "v1").exists()


def test_checkout_never_writes_through_a_symlink_in_the_target(attacked: dict[str, Any]) -> None:
    """`cascade checkout --data` writes into your checkout: a data path under a symlink that leads out
    of it is refused, whatever the record says."""
    project, outside = attacked["project"], attacked["outside"]
    os.symlink(str(outside / "dir"), project.root / "evil")
    record = json.loads(json.dumps(attacked["record"]))
    record["data"] = [_data_entry(record, "evil/payload.bin")]
    (attacked["artifacts"] / "run.json").write_text(json.dumps(record))
    result = project.cascade("checkout", "v1", "--data")
    assert _bytes_under(outside) == 0
    assert result.returncode == 1 and "unsafe record" in result.stderr, result.stderr


def test_legitimate_symlinks_inside_the_worktree_still_restore(project: Project) -> None:
    project.write("data/real.txt", "inside\n")
    project.commit("data")
    os.symlink("data/real.txt", project.root / "alias.txt")  # untracked, pointing inside
    run_id = project.record("--tag", "v-links", "train.py")
    result = project.cascade("restore", "v-links", "--no-run", "--json")
    assert result.returncode == 0, result.stderr
    tree = Path(json.loads(result.stdout)["data"]["worktree"]["path"])
    assert (
        os.readlink(tree / "alias.txt") == "data/real.txt" and (tree / "alias.txt").read_text() == "inside\n"
    )
    assert run_id


def test_show_diff_and_verify_print_hostile_text_inert_and_refuse_malformed_records(project: Project) -> None:
    first = project.record("train.py")
    second = project.record("train.py")
    record_file = _artifact_dir(project, second) / "cascade" / "run.json"
    record = json.loads(record_file.read_text())
    osc52 = "\x1b]52;c;ZXZpbA==\x07"  # would write the terminal's clipboard
    record["experiment"] = "exp\x1b[2J\x1b[H"  # would clear the screen
    record["params"]["values"] = {"[bold red]key[/]": osc52 + "value", "lr": 0.1}
    record["command"]["argv"] = ["--note", "\x1b]0;retitled\x07"]
    # a script's own colours in its exception (they passed, as if cascade's own, even when piped)
    colours = {"type": "ValueError", "message": "\x1b[1mbold\x1b[0m"}
    record["outcome"] = {**(record.get("outcome") or {}), "error": colours}
    hostile_cost = {"share": "\x1b[2J", "every_step": float("inf"), "sampled": -1, "step_ms": [1]}
    record["trace"] = {**record["trace"], "budget": "\x1b[H", "cost": hostile_cost,
                       "records": [[0, 1], [5, "\x1b[2J"]]}  # fmt: skip
    record_file.write_text(json.dumps(record))
    for args in (("show", second), ("show", second, "--trace"), ("diff", first, second),
                 ("verify", first, second)):  # fmt: skip
        result = project.cascade(*args)
        assert result.returncode in (0, 3), (args, result.stderr)
        assert "\x1b" not in result.stdout + result.stderr and "\x07" not in result.stdout, args
    shown = project.cascade("show", second).stdout
    assert "[bold red]key[/]" in shown and "value" in shown  # printed as it is, not as markup
    assert "ValueError: bold" in shown
    traced = json.loads(project.cascade("show", second, "--trace", "--json", check=True).stdout)["data"]
    assert traced["trace"]["cost"] is None and traced["trace"]["budget"] is None  # not numbers: not shown
    assert traced["trace"]["records"] is None  # not a schedule: every step taken to have its record

    for malformed, named in (
        ({"git": "not an object"}, "git is str"),
        ({"data": [{"path": 7}]}, "data[0]"),
        ({"command": {**record["command"], "argv": "--lr 1"}}, "command.argv"),
        ({"git": {**record["git"], "untracked": [{"path": "a", "symlink_target": ["x"]}]}}, "symlink_target"),
        ({"inputs": [{"path": "d/x.bin", "size": "8 kB", "sha256": "0" * 64}]}, "inputs[0].size"),
        ({"inputs": [{"path": "d/x.bin", "size": 8, "sha256": "not a digest"}]}, "inputs[0].sha256"),
        ({"outputs": {"run.log": 1}}, "outputs is dict"),
        ({"checkpoints": [{"path": "c.pt", "md5": "../../../../etc/passwd", "status": "kept"}]},
         "checkpoints[0].md5"),  # an md5 names a path in the DVC cache
        ({"checkpoints": [{"path": "c", "md5": "0" * 32 + ".dir", "files": -1}]}, "checkpoints[0].files"),
        # another run's id: verify compared that run's trace and wrote its verdict on this one
        ({"run_id": first}, "run_id is str"),
        ({"metrics": {**record["metrics"], "keys": {"loss": 1}}}, "metrics.keys.loss"),
        ({"metrics": {**record["metrics"], "keys": {"loss": {"last": "y", "min": 0, "max": 1, "count": 1}}}},
         "metrics.keys.loss"),
        ({"git": {**record["git"], "remotes": [1]}}, "git.remotes"),
        ({"params": {**record["params"], "values": [1]}}, "params.values"),
        ({"trace": {**record["trace"], "artifact": 5}}, "trace.artifact"),
    ):
        record_file.write_text(json.dumps({**record, **malformed}))
        for args in (("show", second), ("diff", first, second), ("restore", second, "--no-run")):
            result = project.cascade(*args)
            assert result.returncode == 1, (args, malformed, result.stderr)
            assert "the run record is malformed" in result.stderr and named in result.stderr, result.stderr
            assert "Traceback" not in result.stderr


def _plain_attacks(record: dict[str, Any], outside: Path) -> dict[str, dict[str, Any]]:
    """Fourteen records whose paths leave the worktree as text alone, each a copy of `record`."""

    def edit(section: str, change: Callable[[Any], Any]) -> dict[str, Any]:
        copy = json.loads(json.dumps(record))
        copy[section] = change(copy[section])
        return copy

    untracked = {"size": 3, "stored": True, "sha256": hashlib.sha256(b"abc").hexdigest()}
    read = {"size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}  # an input git and DVC did not track
    return {
        "untracked ../": edit(
            "git", lambda g: {**g, "untracked": [{**untracked, "path": "../../../outside/u"}]}
        ),
        "untracked absolute": edit(
            "git", lambda g: {**g, "untracked": [{**untracked, "path": str(outside / "u")}]}
        ),
        "untracked in .git": edit(
            "git", lambda g: {**g, "untracked": [{**untracked, "path": ".git/hooks/x"}]}
        ),
        "untracked a/../../": edit("git", lambda g: {**g, "untracked": [{**untracked, "path": "a/../../u"}]}),
        "symlink absolute": edit(
            "git", lambda g: {**g, "untracked": [{**untracked, "path": "l", "symlink_target": str(outside)}]}
        ),  # fmt: skip
        "symlink ../": edit(
            "git",
            lambda g: {
                **g,
                "untracked": [{**untracked, "path": "d/l", "symlink_target": "../../../../outside"}],
            },
        ),  # fmt: skip
        "data ../": edit("data", lambda d: [{**d[0], "path": "../../../outside/payload.bin"}]),
        "data absolute": edit("data", lambda d: [{**d[0], "path": str(outside / "payload.bin")}]),
        "checkpoint ../": edit(
            "checkpoints", lambda c: [{**_checkpoint_entry(record, "../../../outside/c.pt")}]
        ),
        "checkpoint in .git": edit("checkpoints", lambda c: [{**_checkpoint_entry(record, ".git/c.pt")}]),
        "script absolute": edit("command", lambda c: {**c, "script": str(outside / "s.py")}),
        "cwd ../": edit("command", lambda c: {**c, "cwd": "../../.."}),
        "input ../": edit("inputs", lambda i: [{**read, "path": "../../../outside/in.bin"}]),
        "input in .git": edit("inputs", lambda i: [{**read, "path": ".git/hooks/y"}]),
    }


def test_plain_path_traversal_records_are_refused_before_anything_is_written(
    attacked: dict[str, Any],
) -> None:
    project, outside = attacked["project"], attacked["outside"]
    attacks = _plain_attacks(attacked["record"], outside)
    assert len(attacks) == 14
    for name, record in attacks.items():
        (attacked["artifacts"] / "run.json").write_text(json.dumps(record))
        result = project.cascade("restore", "v1", "--no-run")
        assert result.returncode == 1 and "unsafe record" in result.stderr, (name, result.stderr)
        assert _bytes_under(outside) == 0 and not (project.root / ".cascade" / "restore" / "v1").exists(), (
            name
        )
    assert (
        not (project.root / ".git" / "hooks" / "x").exists() and not (project.root / ".git" / "c.pt").exists()
    )
    assert not (project.root / ".git" / "hooks" / "y").exists()


@pytest.mark.parametrize("path", [".git/config", ".git/hooks/post-checkout", ".git", "sub/.git/config",
                                  ".GIT/config"])  # fmt: skip
def test_checkout_never_writes_into_git_s_own_directory(attacked: dict[str, Any], path: str) -> None:
    """A checkpoint or data path in `.git` (a shared DVC remote holding a crafted object): `.git/config`
    with an fsmonitor command, a hook, or a `.git` file naming another git directory runs the
    attacker's code at the next git command. restore refused it; checkout wrote it, and with
    --force overwrote `.git/config`."""
    project = attacked["project"]
    git_dir = project.root / ".git"
    before = {p: p.read_bytes() for p in git_dir.rglob("*") if p.is_file()}
    record = json.loads(json.dumps(attacked["record"]))
    record["checkpoints"] = [_checkpoint_entry(record, path)]
    record["data"] = [_data_entry(record, path)]
    (attacked["artifacts"] / "run.json").write_text(json.dumps(record))
    for args in (("checkout", "v1", "--force"), ("checkout", "v1", "--data", "--force"), ("checkout", "v1")):
        result = project.cascade(*args)
        assert result.returncode == 1 and "unsafe record" in result.stderr, (args, result.stderr)
        assert "git" in result.stderr.lower()
    after = {p: p.read_bytes() for p in git_dir.rglob("*") if p.is_file()}
    assert after == before
    assert not (project.root / "sub").exists() and not (project.root / ".GIT").exists()


def test_a_recorded_commit_is_never_an_option_to_git(attacked: dict[str, Any]) -> None:
    """`git.commit = "--output=FILE"` reached `git diff --stat A B` as an option: `cascade diff`
    truncated FILE (any file the user can write, ~/.bashrc as well)."""
    project, outside = attacked["project"], attacked["outside"]
    precious = outside / "precious.txt"
    precious.write_text("precious data\n")
    other = project.record("ckpt.py")
    record = json.loads(json.dumps(attacked["record"]))
    record["git"]["commit"] = f"--output={precious}"
    (attacked["artifacts"] / "run.json").write_text(json.dumps(record))
    for args in (("diff", "v1", other), ("diff", other, "v1"), ("diff", "v1", "current"), ("show", "v1"),
                 ("verify", "v1", other), ("check", "v1")):  # fmt: skip
        result = project.cascade(*args)
        assert precious.read_text() == "precious data\n", args
        assert "Traceback" not in result.stderr, (args, result.stderr)


def test_restore_never_sets_variables_that_load_code_from_the_record(attacked: dict[str, Any]) -> None:
    """`PYTHONPATH` (a sitecustomize.py) and `LD_PRELOAD` from a record made the re-run load code from
    wherever the record pointed; recorded honestly, PYTHONPATH pointed at the user's checkout rather
    than the restored code. The plan names them; the user exports them if they trust them."""
    project, outside = attacked["project"], attacked["outside"]
    marker = outside / "ran"
    (outside / "evil").mkdir()
    (outside / "evil" / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    record = json.loads(json.dumps(attacked["record"]))
    read = record.get("environment_read") or {}
    git_config = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor",
                  "GIT_CONFIG_VALUE_0": f"touch {marker}"}  # fmt: skip
    record["environment_read"] = {**read, "PYTHONPATH": str(outside / "evil"), **git_config}
    record["environment"] = {**record["environment"], "LD_PRELOAD": str(outside / "evil.so"),
                             "CUDA_INJECTION64_PATH": str(outside / "evil.so")}  # fmt: skip
    (attacked["artifacts"] / "run.json").write_text(json.dumps(record))
    result = project.cascade("restore", "v1")
    assert result.returncode in (0, 3), result.stderr
    assert not marker.exists()
    assert ("not set from the record: CUDA_INJECTION64_PATH, GIT_CONFIG_COUNT, GIT_CONFIG_KEY_0, "
            "GIT_CONFIG_VALUE_0, LD_PRELOAD, PYTHONPATH") in result.stdout + result.stderr
    assert "evil.so" not in result.stderr  # the loader never tried it


def test_newlines_in_a_record_cannot_forge_lines_of_the_plan_show_or_diff(project: Project) -> None:
    """A restore plan is read before the re-run: an argv element or a path with a newline printed
    lines of its own (an `env` line the re-run does not set, a `commit` row), each looking like
    cascade's."""
    first = project.record("train.py")
    second = project.record("--tag", "v-forged", "train.py")
    record_file = _artifact_dir(project, second) / "cascade" / "run.json"
    record = json.loads(record_file.read_text())
    forged_env = "\ncascade:   env        NOTHING_TO_SEE=here"
    record["command"]["argv"] = ["--note", "x" + forged_env]
    record["command"]["cwd"] = ".\ncommit   " + "0" * 40 + " (main)"
    record["params"]["values"] = {"lr\ncommit": "0.1\nforged"}
    error = {"type": "ValueError", "message": "boom\nforged: by the record"}
    record["outcome"] = {**record["outcome"], "status": "FAILED", "exit_code": 1, "error": error}
    record_file.write_text(json.dumps(record))
    project.client().set_tag(second, "mlflow.runName", "x\nforged: a row of ls")
    plan = project.cascade("restore", "v-forged", "--no-run")
    assert plan.returncode == 0, plan.stderr
    assert "NOTHING_TO_SEE" in plan.stderr  # printed, as text of the command line ...
    assert not [line for line in plan.stderr.splitlines() if line.startswith("cascade:   env")]  # ... no line
    assert "$'x\\x0acascade:   env        NOTHING_TO_SEE=here'" in plan.stderr  # to paste: the same argv
    shown = project.cascade("show", second, check=True).stdout
    rows = [line.split()[0] for line in shown.splitlines() if line.strip()]
    assert rows.count("commit") == 1 and rows.count("cwd") == 1, shown  # the forged commit is in the cwd row
    assert "\\ncommit   " + "0" * 40 in shown
    assert not [line for line in shown.splitlines() if line.strip().startswith("forged")], shown
    listed = project.cascade("ls", check=True).stdout
    assert "forged: a row" in listed, listed
    assert not [line for line in listed.splitlines() if line.startswith("forged")], listed
    assert not [line for line in shown.splitlines() if line.startswith("forged")], shown
    for args in (("diff", first, second), ("verify", first, second)):
        said = project.cascade(*args).stdout
        assert not [line for line in said.splitlines() if line.lstrip().startswith("forged")], (args, said)
        assert "NOTHING_TO_SEE" in said, (args, said)  # the difference is named ...
        forged = [line for line in said.splitlines() if line.lstrip().startswith("cascade:")]
        assert not forged, args  # ... on its own line


def test_show_counts_a_thinned_traces_records_as_records_not_steps(project: Project) -> None:
    """`show` printed the trace's record count as its steps: a budget that kept 182 records of 425
    steps said "182 steps". The count is untrusted text as well (one line)."""
    run_id = project.record("train.py")
    record_file = _artifact_dir(project, run_id) / "cascade" / "run.json"
    record = json.loads(record_file.read_text())
    record["trace"] = {**record["trace"], "steps": 182, "records": [[0, 1], [128, 4]]}
    record_file.write_text(json.dumps(record))
    shown = project.cascade("show", run_id, check=True).stdout
    assert "trace: 182 records, thinned by the budget (every 4 from step 128)" in shown, shown
    record["trace"] = {**record["trace"], "steps": "7\ncommit forged", "records": [[0, 1]]}
    record_file.write_text(json.dumps(record))
    shown = project.cascade("show", run_id).stdout
    assert not [line for line in shown.splitlines() if line.startswith("commit forged")], shown
