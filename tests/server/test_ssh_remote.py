"""A DVC remote over SSH (a real OpenSSH server on localhost, key auth, dvc-ssh): the checkpoints a run
keeps are pushed there at its end, and a second clone with an empty DVC cache pulls and md5-checks
them on checkout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.plugin import SCRIPTS, Project, git
from tests.server.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.requires_sshd]


@pytest.fixture
def sshd(isolated_env: Path) -> Iterator[tuple[int, Path, Path]]:
    """An sshd of its own on a free port, accepting one generated key; (port, key, remote directory)."""
    base = Path(tempfile.mkdtemp(prefix="cascade-sshd-"))
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / name)], check=True)
    (base / "authorized_keys").write_text((base / "client.pub").read_text())
    port = free_port()
    config = base / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {base / 'host'}\n"
        f"AuthorizedKeysFile {base}/authorized_keys\n"
        f"PidFile {base / 'sshd.pid'}\nPasswordAuthentication no\nPermitRootLogin prohibit-password\n"
        "StrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # its privilege-separation directory
    process = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while subprocess.run(
        ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True
    ).returncode:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert time.monotonic() < deadline, "sshd did not listen within 30 s"
        time.sleep(0.2)
    host_key = (base / "host.pub").read_text().split()[:2]
    ssh_dir = isolated_env / ".ssh"  # the test's HOME: the server's key is known, nothing else
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_key)}\n")
    remote = base / "remote"
    remote.mkdir()
    try:
        yield port, base / "client", remote
    finally:
        process.terminate()
        process.wait(10)


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_checkpoints_go_to_the_ssh_remote_and_a_second_clone_pulls_them(
    project: Project, sshd: tuple[int, Path, Path], tmp_path: Path
) -> None:
    port, key, remote = sshd
    user = os.environ.get("USER") or "root"
    project.write("ckpt.py", (SCRIPTS / "ckpt.py").read_text())
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "-q"], cwd=project.root, check=True)
    url = f"ssh://{user}@127.0.0.1:{port}{remote}"
    subprocess.run([*dvc, "remote", "add", "-d", "team", url], cwd=project.root, check=True)
    subprocess.run([*dvc, "remote", "modify", "team", "keyfile", str(key)], cwd=project.root, check=True)
    project.cascade("init", check=True)  # keeps the team remote as the default
    project.commit("dvc remote over ssh")
    run_id = project.record("--tag", "v1", "ckpt.py")
    kept = [c for c in project.manifest(run_id)["checkpoints"] if c["status"] == "kept"]
    assert kept and all(c["pushed"] for c in kept), kept
    on_remote = {p.parent.name + p.name for p in (remote / "files" / "md5").rglob("*") if p.is_file()}
    assert {c["md5"] for c in kept} <= on_remote  # every kept checkpoint, by its md5, over SSH

    clone = tmp_path / "machine-b"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    other = Project(clone)
    env = {"MLFLOW_TRACKING_URI": project.tracking_uri}  # the record from the shared store
    out = tmp_path / "restored"
    fetched = other.cascade("checkout", "v1", "--checkpoint", "last", "--to", str(out), "--json", env=env)
    assert fetched.returncode == 0, fetched.stderr
    (item,) = json.loads(fetched.stdout)["data"]["items"]
    assert item["source"].startswith("remote"), item
    last = next(c for c in kept if c["path"] == "checkpoints/final.pt")
    assert _md5(out / "final.pt") == last["md5"] == _md5(project.root / "checkpoints" / "final.pt")
