"""`cascade ui` in a real browser: headless Chromium opens a cascade run in the stock MLflow UI."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.capabilities import chromium_paths
from tests.plugin import CASCADE, Project, git

pytestmark = [pytest.mark.slow, pytest.mark.requires_chromium]
ARTIFACTS = Path(os.environ.get("CASCADE_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers_on(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _chromium() -> tuple[str, str]:
    found = chromium_paths()
    assert found is not None  # the module is marked requires_chromium
    return found


@pytest.fixture
def ui(project: Project) -> Iterator[tuple[Project, str, subprocess.Popen[str]]]:
    port = _free_port()
    process = subprocess.Popen([*CASCADE, "ui", "--port", str(port)], cwd=project.root, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert process.stdout is not None
    url = process.stdout.readline().strip()  # printed once the server answers
    assert url == f"http://127.0.0.1:{port}", process.stderr.read() if process.stderr else ""
    try:
        yield project, url, process
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        deadline = time.monotonic() + 30  # the server is gone with it (its port closed)
        while _answers_on(port):
            assert time.monotonic() < deadline, f"something still listens on {port}"
            time.sleep(0.2)


def test_the_run_page_shows_commit_param_and_version(ui: tuple[Project, str, subprocess.Popen[str]]) -> None:
    project, url, _ = ui
    browser, driver_path = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    project.cascade("run", "--tag", "v-ui-1", "--add", "marker=cascade-ui-check", "train.py", check=True)
    run = project.only_run()
    commit = git(project.root, "rev-parse", "HEAD").strip()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1400"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        chrome.get(f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}")

        def page_text(_: object) -> str | bool:
            text = chrome.find_element(By.TAG_NAME, "body").text
            return text if "cascade-ui-check" in text and commit[:7] in text else False

        text = WebDriverWait(chrome, 90).until(page_text)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        chrome.save_screenshot(str(ARTIFACTS / "ui_run_page.png"))
        assert "v-ui-1" in text  # the version tag
        assert "train.py" in text  # mlflow.source.name
    finally:
        chrome.quit()
    assert (ARTIFACTS / "ui_run_page.png").stat().st_size > 10_000


def test_a_taken_port_is_refused(project: Project) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = project.cascade("ui", "--port", str(port))
    assert result.returncode == 2 and f"port {port} on 127.0.0.1 is already in use" in result.stderr
