"""The child run in a container (`cascade run --docker`), with the same face as `supervisor.Child`.

The workspace, the run directory and a local MLflow store are bind-mounted at their own paths, so
every path the parent hands the child means the same inside; the child talks to the parent through
the run directory exactly as it does outside Docker. The container runs as the calling user, under
Docker's init (signals forwarded, zombies reaped), with the host's network, the requested GPUs and
shared memory; its output is streamed live and to the log; it is removed when it ends.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterable, Mapping, Sequence

from cascade_repro.errors import DockerError
from cascade_repro.run_output import STDERR, STDOUT, RunOutput
from cascade_repro.supervisor import ChildExit, ForwardedSignals

log = logging.getLogger(__name__)

# Host-specific variables that would mislead the container's Python; everything else is passed.
NOT_PASSED = frozenset(
    {
        "PATH",
        "HOME",
        "PWD",
        "OLDPWD",
        "SHELL",
        "SHLVL",
        "_",
        "HOSTNAME",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "LD_LIBRARY_PATH",
        "TMPDIR",
        "LS_COLORS",
        "MAIL",
        "DISPLAY",
        "PS1",
        "TERM_PROGRAM",
        "TERM_PROGRAM_VERSION",
        "COLORTERM",
        "DOCKER_HOST",
    }
)
NOT_PASSED_PREFIXES = ("SSH_", "XDG_", "CONDA_", "DBUS_", "VSCODE_", "PYENV")


@dataclass(frozen=True)
class ContainerSpec:
    image: str  # ID (what the record names), never a tag that could move
    command: Sequence[str]
    environment: Mapping[str, str]
    working_dir: str
    mounts: Sequence[str]  # host paths, mounted read-write at the same path
    gpus: str | int | None = None  # "all", a count, or None
    shm_size: str = "1g"
    network: str = "host"
    user: str = field(default_factory=lambda: f"{os.getuid()}:{os.getgid()}")
    labels: Mapping[str, str] = field(default_factory=dict)


def container_environment(child_env: Mapping[str, str]) -> dict[str, str]:
    env = {
        k: v for k, v in child_env.items() if k not in NOT_PASSED and not k.startswith(NOT_PASSED_PREFIXES)
    }
    env["HOME"] = "/tmp"  # the calling user has no home in the image
    return env


def mount_points(paths: Iterable[Path]) -> list[str]:
    """The fewest absolute paths that contain all `paths` (a nested one is covered by its parent).

    Each is mounted at itself, from its real path, so a path the child is told means the same inside.
    """
    chosen: list[str] = []
    for path in sorted({os.path.abspath(p) for p in paths}):
        if not any(path == c or path.startswith(c.rstrip("/") + "/") for c in chosen):
            chosen.append(path)
    return chosen


class ContainerChild:
    """The training process inside a container. Output goes to the terminal as it comes and to `log_path`."""

    def __init__(
        self, client: Any, spec: ContainerSpec, output: RunOutput, notify: Callable[[str], None]
    ) -> None:
        self._notify = notify
        import docker

        self._output = output  # closed in wait()
        requests = None
        if spec.gpus is not None:
            count = -1 if spec.gpus == "all" else int(spec.gpus)
            requests = [docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])]
        try:
            self.container = client.containers.create(
                spec.image,
                list(spec.command),
                environment=dict(spec.environment),
                working_dir=spec.working_dir,
                user=spec.user,
                init=True,
                network_mode=spec.network,
                shm_size=spec.shm_size,
                device_requests=requests,
                labels=dict(spec.labels),
                detach=True,
                # the real path as the source, the path the child is told as the target
                mounts=[docker.types.Mount(p, os.path.realpath(p), type="bind") for p in spec.mounts],
            )
            self.container.start()
            self.container.reload()
            self._init_pid = int(self.container.attrs["State"].get("Pid") or 0)
            self._stream = client.api.attach(
                self.container.id, stdout=True, stderr=True, stream=True, logs=True, demux=True
            )
        except BaseException as exc:  # nothing may stay running: the run is not recorded
            self.remove()
            if isinstance(exc, docker.errors.DockerException):  # API refusals, a bad --shm-size, no engine
                raise _start_error(exc, spec) from None
            raise
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()
        self._exit: dict[str, Any] = {}
        self._received: int | None = None
        self._signal_count = 0
        self._waiter = threading.Thread(target=self._wait_exit, daemon=True)
        self._waiter.start()
        # from the start on, not from wait(): Ctrl-C while the run is being recorded is the script's
        self._signals = ForwardedSignals(self._forward, notify)

    @property
    def pid(self) -> int:
        """The host PID of the script's process (the first child of the container's init)."""
        try:
            children = Path(f"/proc/{self._init_pid}/task/{self._init_pid}/children").read_text().split()
            return int(children[0]) if children else self._init_pid
        except (OSError, ValueError):
            return self._init_pid

    def wait(self) -> ChildExit:
        """Wait for the container, forwarding Ctrl-C/SIGTERM/SIGHUP; the third signal kills it."""
        try:
            while self._waiter.is_alive():
                self._waiter.join(timeout=0.2)
        finally:
            self._signals.child_ended()
        self._pump_thread.join(timeout=10)
        log_error = self._output.close()
        self.remove()
        code = int(self._exit.get("StatusCode", 1))
        if self._exit.get("error"):
            self._notify(f"lost track of the container: {self._exit['error']}")
        # Docker's init exits 128+N when the script died of signal N.
        killed = (
            code - 128
            if code > 128 and code - 128 in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
            else None
        )
        return ChildExit(code, self._received, killed, log_error)

    def restore_signals(self) -> None:
        self._signals.restore()

    def terminate(self, timeout_s: float = 10.0) -> None:
        """Stop the container (used when the run cannot be recorded at all)."""
        try:
            self.container.stop(timeout=int(timeout_s))
        except Exception as exc:  # already gone
            log.debug("stopping the container: %s", exc)

    def remove(self) -> None:
        container = getattr(self, "container", None)
        if container is None:
            return
        try:
            container.remove(force=True)
        except Exception as exc:  # already removed
            log.debug("removing the container: %s", exc)

    def _wait_exit(self) -> None:
        try:
            self._exit.update(self.container.wait())
        except Exception as exc:
            self._exit["error"] = str(exc)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self._received = self._received or signum
        self._signal_count += 1
        if not self._waiter.is_alive():
            return
        sent = "SIGKILL" if self._signal_count >= 3 else "SIGINT" if signum == signal.SIGINT else "SIGTERM"
        try:
            self.container.kill(signal=sent)
        except Exception as exc:  # it ended meanwhile
            log.debug("signalling the container: %s", exc)

    def _pump(self) -> None:
        try:
            for frame in self._stream:
                for stream, chunk in zip((STDOUT, STDERR), frame, strict=True):
                    if chunk:
                        self._output.feed(stream, chunk)
        except Exception as exc:  # the stream ends with the container
            log.debug("container output stream: %s", exc)


def _start_error(exc: Any, spec: ContainerSpec) -> DockerError:
    text = str(getattr(exc, "explanation", None) or exc)
    if "capabilities: [[gpu]]" in text or "nvidia" in text.lower():
        return DockerError(
            f"the Docker engine cannot give the container GPUs ({text.strip()[:200]})",
            hint="install the NVIDIA Container Toolkit and restart Docker, or run with --gpus none",
        )
    return DockerError(
        f"the container for {spec.image[:19]} did not start: {text.strip()[:300]}",
        hint="run with -v for details; `docker run --rm IMAGE true` checks the image",
    )
