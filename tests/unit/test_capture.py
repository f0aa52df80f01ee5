from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

from cascade_repro.capture.environment import capture_environment
from cascade_repro.capture.git import strip_credentials
from cascade_repro.capture.packages import capture_packages, normalize
from cascade_repro.errors import CascadeError
from cascade_repro.manifest import Manifest
from cascade_repro.redaction import MARKER as REDACTED
from cascade_repro.redaction import secret_variable as looks_secret
from cascade_repro.settings import load_settings, resolve_tracking_uri


@pytest.mark.parametrize(
    ("url", "clean"),
    [
        ("https://user:ghp_token@github.com/org/repo.git", "https://github.com/org/repo.git"),
        ("https://oauth2@gitlab.com/x.git", "https://gitlab.com/x.git"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
        ("https://host/repo.git?token=abc", "https://host/repo.git"),
        ("/srv/git/repo.git", "/srv/git/repo.git"),
    ],
)
def test_remote_credentials_are_stripped(url: str, clean: str) -> None:
    assert strip_credentials(url) == clean


def test_environment_allow_list_and_redaction() -> None:
    environ = {
        "OMP_NUM_THREADS": "4",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "MLFLOW_TRACKING_PASSWORD": "pw",
        "MLFLOW_TRACKING_URI": "https://bob:pw@mlflow.example.com",
        "NCCL_SOCKET_IFNAME": "eth0",
        "HOME": "/root",
        "GITHUB_TOKEN": "gh",
    }
    captured = capture_environment(environ, ("OMP_", "CUDA_", "MLFLOW_", "NCCL_"))
    assert captured == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "MLFLOW_TRACKING_PASSWORD": REDACTED,
        "MLFLOW_TRACKING_URI": f"https://bob:{REDACTED}@mlflow.example.com",
        "NCCL_SOCKET_IFNAME": "eth0",
        "OMP_NUM_THREADS": "4",
    }
    assert looks_secret("AWS_REGION") and looks_secret("HF_TOKEN") and not looks_secret("OMP_NUM_THREADS")


def test_packages_match_importlib_metadata() -> None:
    packages = capture_packages()
    for dist in ("pytest", "pyyaml", "click", "torch", "mlflow"):
        assert packages[dist]["version"] == importlib.metadata.version(dist), dist
    expected = {normalize(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    assert expected <= set(packages) | {""}


def test_editable_and_direct_origins_are_read(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "mypkg-1.2.3.dist-info").mkdir(parents=True)
    (site / "mypkg-1.2.3.dist-info" / "direct_url.json").write_text(
        json.dumps({"url": "file:///src/mypkg", "dir_info": {"editable": True}})
    )
    (site / "Other_Pkg-0.1.dist-info").mkdir()
    (site / "Other_Pkg-0.1.dist-info" / "direct_url.json").write_text(
        json.dumps({"url": "https://github.com/o/p", "vcs_info": {"vcs": "git", "commit_id": "abc"}})
    )
    (site / "legacy-2.0-py3.11.egg-info").mkdir()
    packages = capture_packages([str(site)])
    assert packages["mypkg"] == {"version": "1.2.3", "origin": "editable", "url": "file:///src/mypkg"}
    assert packages["other-pkg"] == {
        "version": "0.1",
        "origin": "git",
        "url": "https://github.com/o/p",
        "commit": "abc",
    }
    assert packages["legacy"]["version"] == "2.0"


def test_tracking_uri_resolution(tmp_path: Path) -> None:
    assert (
        resolve_tracking_uri("sqlite:///mlflow.db", tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    )
    assert resolve_tracking_uri("sqlite:////abs/m.db", tmp_path) == "sqlite:////abs/m.db"
    assert resolve_tracking_uri("http://h:5000", tmp_path) == "http://h:5000"
    settings = load_settings(tmp_path, {"MLFLOW_TRACKING_URI": "http://x:1"})
    assert settings.tracking_uri == "http://x:1" and settings.experiment == tmp_path.name
    (tmp_path / "cascade.yaml").write_text("tracking_uri: sqlite:///db/m.db\nexperiment: e1\n")
    settings = load_settings(tmp_path, {})
    assert settings.tracking_uri == f"sqlite:///{tmp_path.resolve()}/db/m.db" and settings.experiment == "e1"


def test_unknown_setting_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cascade.yaml").write_text("tracking_url: x\n")
    with pytest.raises(CascadeError, match="unknown setting"):
        load_settings(tmp_path, {})


def test_manifest_round_trip_and_newer_schema() -> None:
    manifest = Manifest(
        run_id="r", experiment="e", cascade_version="0", command={"script": "t.py"}, params={},
        determinism={}, git={}, python={}, torch={}, hardware={}, environment={}, container={},
    )  # fmt: skip
    data = json.loads(json.dumps(manifest.to_dict()))
    assert Manifest.from_dict(data) == manifest
    with pytest.raises(CascadeError, match="not one this cascade reads"):
        Manifest.from_dict({**data, "schema": "cascade.run/2"})
    with pytest.raises(CascadeError, match="not a cascade run record"):
        Manifest.from_dict({"run_id": "x"})


def test_import_hook_keeps_loader_class_and_calls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade_repro.child.hooks import ImportHooks

    (tmp_path / "hooked_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    order: list[str] = []

    def after(module):  # type: ignore[no-untyped-def]
        seen.append(module.VALUE)
        module.VALUE += 1

    hooks = ImportHooks(before={"hooked_mod": lambda: order.append("before")}, after={"hooked_mod": after})
    hooks.install()
    try:
        import hooked_mod  # type: ignore[import-not-found]

        assert seen == [41] and hooked_mod.VALUE == 42 and order == ["before"]
        from importlib.machinery import SourceFileLoader

        assert isinstance(hooked_mod.__loader__, SourceFileLoader)
    finally:
        sys.meta_path.remove(hooks)
        sys.modules.pop("hooked_mod", None)


def test_what_capture_records_of_any_site_packages_passes_the_record_check(tmp_path: Path) -> None:
    """pip leaves `~orch-2.1.0.dist-info` behind after a failed uninstall, and an egg-info may say
    `Version:` and nothing: every record made in such a venv was refused as malformed ("the record was
    altered") by show, restore, diff and verify. The leftover is no installed package; an empty
    version is recorded as it is, and records that older versions wrote with either still read."""
    from cascade_repro.images.context import requirements_from_packages
    from cascade_repro.record_shape import check_shape

    site = tmp_path / "site"
    (site / "~orch-2.1.0.dist-info").mkdir(parents=True)
    (site / "numpy-2.1.0.dist-info").mkdir()
    (site / "bare.egg-info").mkdir()
    (site / "bare.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: bare\nVersion: \n")
    packages = capture_packages([str(site)])
    assert set(packages) == {"numpy", "bare"} and packages["bare"]["version"] == ""
    check_shape({"python": {"packages": packages}})
    older = {**packages, "~orch": {"version": "2.1.0"}}  # as recorded before
    check_shape({"python": {"packages": older}})
    reqs = requirements_from_packages(older)
    assert [line for line in reqs.text.splitlines() if line and not line.startswith("#")] == ["numpy==2.1.0"]


def test_a_sqlite_store_address_names_the_file_sqlalchemy_opens(tmp_path: Path) -> None:
    """`sqlite:////x/mlflow.db?timeout=30` crashed every command (the query was taken for part of the
    file name); `%20` was not decoded; a repository under a directory named with `?` or `%` gave the
    script's MLflow and `mlflow ui` another file than cascade's."""
    from sqlalchemy.engine import make_url

    from cascade_repro.settings import sqlite_path, sqlite_uri

    assert sqlite_path("sqlite:////tmp/x/mlflow.db?timeout=30") == Path("/tmp/x/mlflow.db")
    assert sqlite_path("sqlite:////tmp/my%20dir/m.db") == Path("/tmp/my dir/m.db")
    odd = tmp_path / "what?" / "100%" / "a#b"
    odd.mkdir(parents=True)
    for given in ("sqlite:///mlflow.db", "sqlite:///mlflow.db?timeout=30"):
        uri = resolve_tracking_uri(given, odd)
        assert make_url(uri).database == str(odd.resolve() / "mlflow.db") == str(sqlite_path(uri))
    with_query = resolve_tracking_uri("sqlite:///mlflow.db?timeout=30", odd)
    assert dict(make_url(with_query).query) == {"timeout": "30"}
    assert make_url(sqlite_uri(odd / "m.db")).database == str(odd / "m.db")
