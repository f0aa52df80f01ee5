"""Secrets in a script's argv and environment never reach the store, git, DVC or leftover files, and a
restore re-runs such a run with the values this machine supplies (real runs, real stores)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.plugin import CASCADE, Project, wait_for_file

pytestmark = pytest.mark.slow

# Every secret is a distinct string, so a single grep finds any copy of it anywhere.
ARGV_SECRETS = {
    "--api-key=": "sk-live-AAAA1111",
    "--token": "sk-tok-BBBB2222",
    "db.password=": "hunter2-CCCC3333",
    "url password": "pw-DDDD4444",
}
ENV = {
    "DB_PASS": "dbpass-EEEE5555",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T000/B000/XXXXsecret",
    "SENTRY_DSN": "https://key-FFFF6666@o1.ingest.sentry.io/1",
    "DATABASE_URL": "postgresql://app:GGGG7777@db.example.com/prod",
    "HF_TOKEN": "hf-HHHH8888",  # allow-listed prefix: recorded whatever the script reads
    "HF_ENDPOINT": "https://bob:IIII9999@hf.example.com",
}
SECRETS = [*ARGV_SECRETS.values(), "XXXXsecret", "EEEE5555", "FFFF6666", "GGGG7777", "HHHH8888", "IIII9999"]
# The script reads the variables that no allow-list records: they are recorded because it read them.
READS = """import os
for name in ("DB_PASS", "SLACK_WEBHOOK_URL", "SENTRY_DSN", "DATABASE_URL"):
    os.environ.get(name)
"""
READER = (
    READS
    + """import runpy
runpy.run_path("train.py", run_name="__main__")
import cascade_repro, torch
cascade_repro.checkpoint({"w": torch.zeros(2)}, step=0)  # an object for the DVC cache and remote
"""
)


def _argv() -> list[str]:
    return [
        f"--api-key={ARGV_SECRETS['--api-key=']}",
        "--token", ARGV_SECRETS["--token"],
        f"db.password={ARGV_SECRETS['db.password=']}",
        "--data-url", f"https://alice:{ARGV_SECRETS['url password']}@data.example.com/set",
    ]  # fmt: skip


def _occurrences(roots: list[Path], skip: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Secret → files under `roots` holding it (`skip`: directory names not searched)."""
    found: dict[str, list[str]] = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and not set(path.relative_to(root).parts) & set(skip):
                data = path.read_bytes()
                for secret in SECRETS:
                    if secret.encode() in data:
                        found.setdefault(secret, []).append(str(path))
    return found


def _git_objects(root: Path) -> bytes:
    return subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=root, capture_output=True, check=True
    ).stdout


@pytest.fixture
def secret_project(project: Project) -> Project:
    project.write("read_env.py", READER)
    project.cascade("init", check=True)  # a DVC cache and a local remote, searched as well
    project.commit("a script that reads secrets")
    return project


def test_no_secret_of_argv_or_environment_is_stored_anywhere(secret_project: Project) -> None:
    project = secret_project
    run_id = project.record("--tag", "s1", "read_env.py", *_argv(), env=ENV)
    seen = json.loads((project.root / "out" / "seen.json").read_text())
    assert seen["argv"] == _argv()  # the script itself got every value
    run = project.client().get_run(run_id)
    manifest = project.manifest(run_id)

    recorded = [
        "--api-key=<redacted>", "--token", "<redacted>", "db.password=<redacted>",
        "--data-url", "https://alice:<redacted>@data.example.com/set",
    ]  # fmt: skip
    assert manifest["command"]["argv"] == recorded
    assert json.loads(run.data.tags["cascade.argv"]) == recorded
    assert manifest["command"]["invocation"][-len(recorded) :] == recorded
    assert "--api-key=<redacted>" in run.data.tags["mlflow.note.content"]
    assert manifest["environment_read"]["DB_PASS"] == "<redacted>"
    assert manifest["environment_read"]["SLACK_WEBHOOK_URL"] == "<redacted>"
    assert manifest["environment_read"]["SENTRY_DSN"] == "<redacted>"
    assert manifest["environment_read"]["DATABASE_URL"] == "postgresql://app:<redacted>@db.example.com/prod"
    assert manifest["environment"]["HF_TOKEN"] == "<redacted>"
    assert manifest["environment"]["HF_ENDPOINT"] == "https://bob:<redacted>@hf.example.com"

    # grep: the store, its artifacts, the DVC cache and remote (under HOME), leftovers under .cascade
    assert (project.root / "mlflow.db").is_file() and (project.root / "mlruns").is_dir()
    assert [p for p in (project.root / ".dvc" / "cache").rglob("*") if p.is_file()]
    home = Path(os.environ["HOME"])
    assert [p for p in (home / ".cascade" / "dvc-remote").rglob("*") if p.is_file()]
    # out/ is the script's own output (it wrote its argv there): not cascade's to redact
    assert _occurrences([project.root, home], skip=(".git", "out")) == {}
    objects = _git_objects(project.root)
    assert b"cascade version s1" in objects  # the annotated tag is among the objects searched
    assert [s for s in SECRETS if s.encode() in objects] == []
    assert not [p for p in (project.root / ".cascade" / "runs").iterdir() if p.is_dir()]  # removed


def test_restore_takes_redacted_values_from_the_environment(secret_project: Project) -> None:
    project = secret_project
    project.record("--tag", "s2", "read_env.py", *_argv(), env=ENV)
    variables = {
        "CASCADE_SECRET_API_KEY": ARGV_SECRETS["--api-key="],
        "CASCADE_SECRET_TOKEN": ARGV_SECRETS["--token"],
        "CASCADE_SECRET_DB_PASSWORD": ARGV_SECRETS["db.password="],
        "CASCADE_SECRET_DATA_URL": ARGV_SECRETS["url password"],
    }
    worktree = project.root / ".cascade" / "restore" / "s2"

    # Without the values: refused before anything is written, naming every variable to set.
    partial = {"CASCADE_SECRET_TOKEN": ARGV_SECRETS["--token"]}
    result = project.cascade("restore", "s2", env={**ENV, **partial})  # the plan is printed, then refused
    assert result.returncode == 1, result.stderr
    for name in ("CASCADE_SECRET_API_KEY", "CASCADE_SECRET_DB_PASSWORD", "CASCADE_SECRET_DATA_URL"):
        assert name in result.stderr
    assert "CASCADE_SECRET_TOKEN," not in result.stderr  # supplied: not asked for
    assert "--api-key: redacted in the record, taken from $CASCADE_SECRET_API_KEY (NOT SET" in result.stderr
    assert "DB_PASS: redacted in the record, this machine's value" in result.stderr
    assert not worktree.exists()

    # With them: the script gets the real values back and the re-run reproduces the run bit for bit.
    result = project.cascade("restore", "s2", "--json", env={**ENV, **variables})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    plan = data["plan"]
    assert [(s["option"], s["variable"]) for s in plan["secret_args"]] == [
        ("--api-key", "CASCADE_SECRET_API_KEY"), ("--token", "CASCADE_SECRET_TOKEN"),
        ("db.password", "CASCADE_SECRET_DB_PASSWORD"), ("--data-url", "CASCADE_SECRET_DATA_URL"),
    ]  # fmt: skip
    assert plan["secrets_missing"] == []
    assert plan["secret_env"] == {
        "DATABASE_URL": True, "DB_PASS": True, "HF_ENDPOINT": True, "HF_TOKEN": True,
        "SENTRY_DSN": True, "SLACK_WEBHOOK_URL": True,
    }  # fmt: skip
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    seen = json.loads((worktree / "out" / "seen.json").read_text())
    assert seen["argv"] == _argv()
    restored = project.manifest(data["run"]["run_id"])
    assert "CASCADE_SECRET_API_KEY" not in restored["environment"]  # not handed to the script

    # --no-run needs no value: it prints the command with the variables in their places.
    result = project.cascade("restore", "s2", "--no-run", env=ENV)
    assert result.returncode == 0, result.stderr
    # (each in double quotes: the shell expands the variable, and a value with a space stays one word)
    assert '"--api-key=${CASCADE_SECRET_API_KEY}" --token "${CASCADE_SECRET_TOKEN}"' in result.stderr
    assert '"https://alice:${CASCADE_SECRET_DATA_URL}@data.example.com/set"' in result.stderr
    home = Path(os.environ["HOME"])
    assert _occurrences([project.root, home], skip=(".git", "out")) == {}
    assert [s for s in SECRETS if s.encode() in _git_objects(project.root)] == []


def test_hand_off_files_are_private_and_hold_no_secret(project: Project, tmp_path: Path) -> None:
    """The child alone (as when its parent died): what it leaves in the run directory."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    project.write("reads.py", READS + "import cascade_repro\ncascade_repro.log_metrics({'x': 1.0})\n")
    env = {**os.environ, **ENV, "CASCADE_RUN_DIR": str(run_dir)}
    subprocess.run([sys.executable, "-m", "cascade_repro.child.bootstrap", "reads.py", *_argv()],
                   cwd=project.root, env=env, check=True, timeout=120)  # fmt: skip
    facts = json.loads((run_dir / "child.json").read_text())
    assert facts["environment_read"]["DB_PASS"] == "<redacted>"
    assert facts["environment_read"]["DATABASE_URL"] == "postgresql://app:<redacted>@db.example.com/prod"
    assert _occurrences([run_dir]) == {}
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir()}
    assert {"child.json", "events.jsonl"} <= set(modes)
    assert modes == dict.fromkeys(modes, 0o600)


def test_the_run_directory_is_private_while_the_script_runs_and_gone_after(project: Project) -> None:
    process = subprocess.Popen(
        [*CASCADE, "run", "train.py", "--hang", "--token", ARGV_SECRETS["--token"]], cwd=project.root,
        env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_file(project.root / "out" / "ready", process)
    time.sleep(1.0)  # the parent opens the run meanwhile
    (run_dir,) = [p for p in (project.root / ".cascade" / "runs").iterdir() if p.is_dir()]
    dir_mode = stat.S_IMODE(run_dir.stat().st_mode)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir() if p.is_file()}
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=120)

    assert dir_mode == 0o700
    handed_off = {"params.json", "child.json", "events.jsonl", "trace.jsonl", "output.log"}
    assert handed_off <= set(modes), modes
    assert {name: modes[name] for name in handed_off} == dict.fromkeys(handed_off, 0o600)
    assert not run_dir.exists()
    assert project.only_run().info.status == "KILLED"
