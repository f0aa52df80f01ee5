"""`cascade ui`'s server environment (the server itself: tests/cli/test_first_hour.py)."""

from __future__ import annotations

from cascade_repro.store.ui_server import JOBS_SETTING, server_environment


def test_mlflow_job_workers_are_off_unless_the_user_set_them() -> None:
    assert server_environment({"HOME": "/h"}) == {JOBS_SETTING: "false", "HOME": "/h"}
    for choice in ("true", "false", ""):  # the user's own, whatever it is
        users = {JOBS_SETTING: choice, "HOME": "/h"}
        assert server_environment(users) == users
