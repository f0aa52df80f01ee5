"""cascade.yaml + CASCADE_* / MLFLOW_TRACKING_URI variables → one frozen Settings object, and the
two tables every module reads instead of spelling them itself: the variables a user may set
(`VARIABLES`) and the paths cascade keeps in a project (`ProjectPaths`).

The variables between `cascade run` and its child (the run directory, the seed, ...) are not user
settings: they are the child's protocol (child/protocol.py). One name is both: CASCADE_DETERMINISM,
which the user may set and which the parent passes on, resolved, for the child to apply."""

from __future__ import annotations

import math
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from cascade_repro.errors import ConfigError
from cascade_repro.yaml_io import read_yaml_mapping

SETTINGS_FILE = "cascade.yaml"
SERVER_SCHEMES = ("http", "https", "databricks")  # a tracking server: it owns the artifact store
OWN_DIR = ".cascade"  # cascade's own files in a project; `cascade init` ignores it
# What a project holds that is cascade's (the embedded store, its own directory): never the user's code.
OWN_ENTRIES = (OWN_DIR, "mlruns", "mlartifacts", "mlflow.db")
RESTORE_MARKER = "cascade-restore.json"  # in a restore worktree's own git dir, never in its files

# Every environment variable a user may set for cascade, and what it does.
VARIABLES = {
    "MLFLOW_TRACKING_URI": "the store (wins over CASCADE_TRACKING_URI and cascade.yaml's tracking_uri)",
    "CASCADE_TRACKING_URI": "the store, where MLFLOW_TRACKING_URI is not set",
    "CASCADE_EXPERIMENT": "the experiment's name (wins over cascade.yaml's experiment)",
    "CASCADE_DETERMINISM": "off | warn | strict (wins over cascade.yaml's determinism)",
    "CASCADE_PROGRESS_EVERY": "seconds between progress lines when stderr is not a terminal (0: none)",
    "CASCADE_IMAGE": "the image a container was started from, where cascade did not start it",
    "CASCADE_IMAGE_ID": "that image's ID",
    "CASCADE_SECRET_<NAME>": "a secret argument's value: pass ${CASCADE_SECRET_NAME}, recorded redacted",
}
# The variables that change Settings (`cascade run` names them as the source of its settings).
SETTINGS_VARIABLES = (
    "MLFLOW_TRACKING_URI",
    "CASCADE_TRACKING_URI",
    "CASCADE_EXPERIMENT",
    "CASCADE_DETERMINISM",
)
DEFAULT_TRACE_BUDGET = 0.02  # of step time, for fingerprinting the weights (issue 17)
TRACE_BUDGET_EXPECTED = "a share of step time from 0 to 1 (0.02: 2 %; 0: every facet every step)"
DEFAULT_ENV_PREFIXES = (
    "CUDA_", "CUBLAS_", "CUDNN_", "NCCL_", "NVIDIA_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "KMP_",
    "OPENBLAS_", "ATEN_", "PYTHONHASHSEED", "CASCADE_", "MLFLOW_", "HF_", "XLA_", "LD_PRELOAD",
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_",
    "PYTHONPATH",  # where packages outside the environment came from: recorded, never set by a restore
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """Everything configurable, resolved once per command and passed down."""

    root: Path
    experiment: str
    tracking_uri: str
    params_file: str | None = None
    checkpoints_dir: str = "checkpoints"
    determinism: str = "warn"
    untracked_max_bytes: int = 1024 * 1024
    env_allow_prefixes: tuple[str, ...] = DEFAULT_ENV_PREFIXES
    key_metrics: tuple[str, ...] = ()
    dvc_remote: str | None = None
    docker: Mapping[str, Any] = field(default_factory=dict)
    metrics_flush_s: float = 5.0
    trace_interval: int = 1  # record every Nth optimizer step; 0 turns the trace off
    # The weights (and gradients) are fingerprinted as often as this share of step time allows; the RNG
    # state, batch and loss every step. 0 (`trace: full`): every facet every step.
    trace_budget: float = DEFAULT_TRACE_BUDGET
    # Gradient fingerprints tell "backward differs" from "a write between steps". None ("auto"): where
    # cheap (on an accelerator; on CPU for models up to 1 MiB of parameters).
    trace_grads: bool | None = None
    checkpoint_policy: Mapping[str, Any] = field(default_factory=dict)  # monitor, mode, save_top_k, save_last
    log_checkpoints: bool = False  # also log checkpoint files as MLflow artifacts (heavy)
    # How a checkpoint enters the DVC cache where no reflink can be made: "copy" (the default, DVC's
    # own) leaves the workspace file the script's; "hardlink" saves the copy, but the file turns
    # read-only, and a later write in place (by root) would change the cache object with it.
    checkpoint_link: str = "copy"

    @property
    def paths(self) -> ProjectPaths:
        return ProjectPaths(self.root)

    @property
    def runs_dir(self) -> Path:
        """Where run directories live while a run is going (ignored by git, see `cascade init`)."""
        return self.paths.runs

    @property
    def artifact_root(self) -> str | None:
        """Where a new experiment keeps its artifacts: `mlruns/` beside a local or database store;
        None for a tracking server, whose own artifact root (`--serve-artifacts`, S3) is the one
        every machine of the team can read."""
        if is_tracking_server(self.tracking_uri):
            return None
        return (self.root / "mlruns").as_uri()


def _read_line(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="surrogateescape").strip()


def _common_git_dir(root: Path) -> Path:
    """The repository's common git directory, read from its files: `.git` itself, or, where `.git`
    is a file (the project a linked worktree, a submodule), the directory it names and its `commondir`."""
    dot_git = root / ".git"
    if not dot_git.is_file():
        return dot_git
    named = _read_line(dot_git).removeprefix("gitdir:").strip()
    git_dir = Path(os.path.normpath(root / named))
    try:
        return Path(os.path.normpath(git_dir / _read_line(git_dir / "commondir")))
    except OSError:  # a submodule's or a separate git directory: common to itself
        return git_dir


@dataclass(frozen=True)
class ProjectPaths:
    """Every path cascade keeps in a project: under `.cascade/`, which git ignores."""

    root: Path

    @property
    def own(self) -> Path:
        return self.root / OWN_DIR

    @property
    def runs(self) -> Path:
        """A directory per run while it goes, and what is pending delivery (`cascade sync`)."""
        return self.own / "runs"

    @property
    def jobs(self) -> Path:
        """A torchrun job's directory per rendezvous id, where the other ranks hand over their files."""
        return self.own / "jobs"

    @property
    def builds(self) -> Path:
        """Image build contexts and logs (`--docker`, `cascade image build`)."""
        return self.own / "builds"

    @property
    def restores(self) -> Path:
        """The worktrees `cascade restore` makes, one per version or run."""
        return self.own / "restore"

    @property
    def file_hashes(self) -> Path:
        """The sha256 of files the project's runs read, known by their stat (file_hashes.py)."""
        return self.own / "file_hashes.json"

    @property
    def set_aside(self) -> Path:
        """Files found in a restore worktree after a restore killed during its re-run, moved here
        rather than deleted: the cut re-run's outputs, or files someone added since."""
        return self.own / "set-aside"

    def spool_dirs(self) -> list[Path]:
        """Where run directories may wait for delivery: this project's, and each restore worktree's (a
        restore killed during its re-run leaves that run's there), in `.cascade/restore/` or made
        with `--workdir` elsewhere (a linked worktree of the repository with a restore's marker)."""
        try:
            worktrees = [p for p in self.restores.iterdir()  # (a link there: restore/outside_links.py)
                         if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")]  # fmt: skip
        except OSError:  # no restore yet
            worktrees = []
        seen = {os.path.realpath(w) for w in worktrees}  # (.cascade may be a symlink: one spool, once)
        worktrees += [w for w in self._marked_worktrees() if os.path.realpath(w) not in seen]
        return [self.runs] + [w / OWN_DIR / "runs" for w in sorted(set(worktrees))]

    def _marked_worktrees(self) -> list[Path]:
        """The repository's linked worktrees that a restore made: read from git's own files (no git
        process: every command asks), `worktrees/NAME/` in the common git directory holding the
        marker and `gitdir` (absolute, or relative to it: git's worktree.useRelativePaths)."""
        found: list[Path] = []
        try:
            linked = list((_common_git_dir(self.root) / "worktrees").iterdir())
        except OSError:  # none
            return found
        for entry in linked:
            try:
                if not (entry / RESTORE_MARKER).is_file():
                    continue
                dot_git = Path(os.path.normpath(entry / _read_line(entry / "gitdir")))
            except OSError:
                continue
            if dot_git.name == ".git":
                found.append(dot_git.parent)
        return found

    @property
    def replays(self) -> Path:
        """The tensors `cascade verify --replay` saves at a divergent step."""
        return self.own / "replays"

    @property
    def ui_log(self) -> Path:
        return self.own / "ui.log"

    @property
    def init_advised(self) -> Path:
        """Marker: the first run without `cascade init` said what init would add (said once)."""
        return self.own / "init-advised"


def load_settings(root: Path, environ: Mapping[str, str] | None = None) -> Settings:
    """Every value is checked here, so a bad one is named (file, key, value, what is expected) before
    anything starts or is created."""
    env = os.environ if environ is None else environ
    path = root / SETTINGS_FILE
    raw = read_yaml_mapping(path) if path.is_file() else {}
    known = {
        "experiment", "tracking_uri", "params_file", "checkpoints_dir", "determinism",
        "untracked_max_bytes", "env_allow_prefixes", "key_metrics", "dvc", "docker",
        "metrics_flush_s", "trace_interval", "trace_grads", "checkpoints", "log_checkpoints", "trace_budget",
        "trace", "checkpoint_link",
    }  # fmt: skip
    unknown = sorted(str(key) for key in set(raw) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {', '.join(unknown)}",
            hint=f"known settings are: {', '.join(sorted(known))}",
        )
    check = _Checker(path, raw)
    tracking = (
        env.get("MLFLOW_TRACKING_URI")
        or env.get("CASCADE_TRACKING_URI")
        or check.text("tracking_uri")
        or "sqlite:///mlflow.db"
    )
    dvc = check.mapping("dvc", known={"remote"})
    docker = check.mapping("docker")
    if "enabled" in docker and not isinstance(docker["enabled"], bool):
        raise check.bad("docker.enabled", docker["enabled"], "true or false")
    return Settings(
        root=root,
        experiment=str(
            env.get("CASCADE_EXPERIMENT")
            or check.text("experiment", numbers=True)
            or default_experiment(root)
        ),  # fmt: skip
        tracking_uri=resolve_tracking_uri(str(tracking), root),
        params_file=check.text("params_file"),
        checkpoints_dir=check.text("checkpoints_dir") or "checkpoints",
        determinism=_determinism(env, check),
        untracked_max_bytes=check.integer("untracked_max_bytes", 2**20, 0, "a whole number of bytes >= 0"),
        env_allow_prefixes=check.texts("env_allow_prefixes", "a list of variable-name prefixes")
        or DEFAULT_ENV_PREFIXES,
        key_metrics=check.texts("key_metrics", "a list of metric names, e.g. [val_loss, val_acc]"),
        dvc_remote=check.text("remote", dvc, "dvc.remote"),
        docker=docker,
        metrics_flush_s=check.seconds("metrics_flush_s", 5.0),
        trace_interval=check.integer("trace_interval", 1, 0, "a whole number of steps >= 0 (0: no trace)"),
        trace_grads=_trace_grads(check),
        trace_budget=_trace_budget(check),
        checkpoint_policy=_checkpoint_policy(check),
        log_checkpoints=check.flag("log_checkpoints", False),
        checkpoint_link=_checkpoint_link(check),
    )


def _checkpoint_link(check: _Checker) -> str:
    value = check.text("checkpoint_link") or "copy"
    if value not in ("copy", "hardlink"):
        raise check.bad("checkpoint_link", value, "copy or hardlink (a reflink is made first where it can)")
    return value


def is_tracking_server(uri: str) -> bool:
    """A tracking server (it owns the artifact store and has its own UI), not a file or database."""
    return uri.split(":", 1)[0] in SERVER_SCHEMES


def default_experiment(root: Path) -> str:
    """The experiment of a project whose cascade.yaml names none: its git remote's repository name
    (the same on every clone, whatever its directory is called), else the directory's name."""
    from cascade_repro.store import git_repo

    return repository_name(git_repo.remote_url(root, "origin") or "") or root.name


def repository_name(url: str) -> str | None:
    """`https://host/org/vision.git`, `git@host:org/vision.git`, `/srv/git/vision` → vision."""
    tail = url.rstrip("/").replace(":", "/").rsplit("/", 1)[-1]
    name = tail.removesuffix(".git")
    return name or None


class _Checker:
    """Reads one value of cascade.yaml (or of a mapping in it) as the type its setting needs."""

    def __init__(self, path: Path, raw: Mapping[str, Any]) -> None:
        self.path = path
        self.raw = raw

    def bad(self, key: str, value: Any, expected: str) -> ConfigError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return ConfigError(
            f"{self.path.name}: {key} is {shown}; expected {expected}",
            hint=f"fix `{key}` in {self.path}, or remove it for the default",
        )

    def get(self, key: str, default: Any, within: Mapping[str, Any] | None = None) -> Any:
        """The value, or the default where the key is absent or empty (`key:` alone is null)."""
        value = (self.raw if within is None else within).get(key)
        return default if value is None else value

    def text(self, key: str, within: Mapping[str, Any] | None = None, name: str | None = None,
             numbers: bool = False) -> str | None:  # fmt: skip
        value = (self.raw if within is None else within).get(key)
        if value is None or isinstance(value, str):
            return value or None
        if numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise self.bad(name or key, value, "a text value")

    def texts(self, key: str, expected: str) -> tuple[str, ...]:
        value = self.raw.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise self.bad(key, value, expected)
        return tuple(value)

    def flag(self, key: str, default: bool, within: Mapping[str, Any] | None = None,
             name: str | None = None) -> bool:  # fmt: skip
        value = self.get(key, default, within)
        if not isinstance(value, bool):
            raise self.bad(name or key, value, "true or false")
        return value

    def integer(self, key: str, default: int, minimum: int, expected: str,
                within: Mapping[str, Any] | None = None, name: str | None = None) -> int:  # fmt: skip
        value = self.get(key, default, within)
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            number = int(value)  # `1e6`
        elif isinstance(value, str):
            try:
                number = int(value)
            except ValueError:
                number = None
        if number is None or number < minimum:
            raise self.bad(name or key, value, expected)
        return number

    def seconds(self, key: str, default: float) -> float:
        value = self.get(key, default)
        try:
            seconds = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise self.bad(key, value, "a number of seconds > 0")
        return seconds

    def mapping(self, key: str, known: set[str] | None = None) -> dict[str, Any]:
        value = self.raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.bad(key, value, f"a mapping of {key} settings, e.g. `{key}: {{enabled: true}}`"
                           if key == "docker" else f"a mapping of {key} settings")  # fmt: skip
        unknown = sorted(str(k) for k in set(value) - (known or set(value)))
        if unknown:
            raise ConfigError(
                f"{self.path.name}: unknown {key} setting(s) {', '.join(unknown)}",
                hint=f"known: {', '.join(sorted(known or ()))}; fix them in {self.path}",
            )
        return dict(value)


def _determinism(env: Mapping[str, str], check: _Checker) -> str:
    modes = ("off", "warn", "strict")
    if env.get("CASCADE_DETERMINISM"):
        if env["CASCADE_DETERMINISM"] not in modes:
            raise ConfigError(
                f"CASCADE_DETERMINISM is {env['CASCADE_DETERMINISM']!r}; expected off, warn or strict",
                hint="fix or unset CASCADE_DETERMINISM",
            )
        return env["CASCADE_DETERMINISM"]
    value = check.raw.get("determinism")
    if value is False:  # YAML 1.1 reads a bare `off` (also `no`, `false`) as false
        return "off"
    if value is None:
        return "warn"
    if value not in modes:
        raise check.bad("determinism", value, "off, warn or strict")
    return str(value)


def _checkpoint_policy(check: _Checker) -> dict[str, Any]:
    known = {"monitor", "mode", "save_top_k", "save_last"}
    raw = check.mapping("checkpoints", known=known)
    policy: dict[str, Any] = {}
    if raw.get("monitor") is not None:
        policy["monitor"] = check.text("monitor", raw, "checkpoints.monitor")
    if raw.get("mode") is not None:
        if raw["mode"] not in ("min", "max"):
            raise check.bad("checkpoints.mode", raw["mode"], "min or max")
        policy["mode"] = raw["mode"]
    if raw.get("save_top_k") is not None:
        policy["save_top_k"] = check.integer("save_top_k", 3, -1, "a whole number >= -1 (-1: keep all)",
                                             within=raw, name="checkpoints.save_top_k")  # fmt: skip
    if raw.get("save_last") is not None:
        policy["save_last"] = check.flag("save_last", True, within=raw, name="checkpoints.save_last")
    return policy


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` store URI (absolute after resolve_tracking_uri), else None:
    as SQLAlchemy reads it, the path before any `?query`, %XX decoded."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(urllib.parse.unquote(uri[len("sqlite:///") :].partition("?")[0]))


def sqlite_uri(path: Path, query: str = "") -> str:
    """The `sqlite:///` URI SQLAlchemy (so MLflow) reads as the database file `path`: `%` and `?` in
    it quoted, nothing else changed."""
    quoted = str(path).replace("%", "%25").replace("?", "%3F")
    return f"sqlite:///{quoted}" + (f"?{query}" if query else "")


def resolve_tracking_uri(uri: str, root: Path) -> str:
    """Make relative sqlite/file stores absolute against the repo root, as `mlflow ui` there sees them."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        relative, _, query = uri[len("sqlite:///") :].partition("?")
        return sqlite_uri((root / urllib.parse.unquote(relative)).resolve(), query)
    if "://" not in uri and not uri.startswith("databricks"):
        return (root / uri).resolve().as_uri()
    return uri


def _trace_budget(check: _Checker) -> float:
    """`trace_budget: 0.02` (a share of step time, 0 to 1), or `trace: full` for 0."""
    full = check.raw.get("trace")
    if full is not None and full != "full":
        raise check.bad("trace", full, "full (every facet every step), or leave it out for trace_budget")
    value = check.get("trace_budget", 0.0 if full == "full" else DEFAULT_TRACE_BUDGET)
    return trace_budget(value, lambda: check.bad("trace_budget", value, TRACE_BUDGET_EXPECTED))


def trace_budget(value: Any, refuse: Callable[[], Exception]) -> float:
    """A trace budget as given (cascade.yaml, --trace-budget): a number from 0 to 1."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and 0 <= number <= 1):
        raise refuse()
    return number


def _trace_grads(check: _Checker) -> bool | None:
    value = check.raw.get("trace_grads", "auto")
    if value is None or value == "auto":
        return None
    if isinstance(value, bool):
        return value
    raise check.bad("trace_grads", value, "true, false or auto")
