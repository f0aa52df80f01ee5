"""The run record's sections as typed objects: what cascade acts on, read in one place.

Each section keeps the JSON object it was read from (`raw`), so a record round-trips unchanged,
fields written by another cascade version included, and the field catalogue can still read a field
by its name (`section.get("cudnn")`). What commands act on is a typed accessor here, with the
coercion written once: `record.torch.num_threads` is an int or None, `record.gpus` the GPUs the run
used, `entry.object_md5` the bytes a data entry stands for. `record_shape.check_shape` has checked
the JSON types before any of these is built from a stored record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

S = TypeVar("S", bound="Section")


@dataclass(frozen=True)
class Section:
    """One JSON object of the record, as recorded; falsy when the record has none."""

    raw: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """A field by its recorded name (the catalogue's table-driven reads)."""
        return self.raw.get(key, default)

    def __bool__(self) -> bool:
        return bool(self.raw)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)

    @classmethod
    def of(cls: type[S], raw: Mapping[str, Any] | Section | None) -> S:
        """The section over `raw` (None or absent: an empty one)."""
        if isinstance(raw, cls):
            return raw
        return cls(dict(raw.raw if isinstance(raw, Section) else raw or {}))

    @classmethod
    def each(cls: type[S], entries: Any) -> tuple[S, ...]:
        """A list of entries (data, checkpoints, inputs, outputs, untracked files) as sections."""
        return tuple(cls.of(e) for e in entries or ())


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def single_line(text: Any) -> str:
    """A record's text on one line: its newlines shown as `\\n` (a verdict or a line printed from it
    never gets a line the record wrote)."""
    return str(text).replace("\r\n", "\n").replace("\n", "\\n")


def error_line(error: Any, limit: int | None = None) -> str:
    """`RuntimeError: boom` for a recorded exception (`{type, message}`, untrusted), the type alone where
    its message is empty (Ctrl-C's `KeyboardInterrupt`), "" for none; `limit` cuts a long message. One
    line (`single_line`)."""
    if not isinstance(error, Mapping) or not error.get("type"):
        return ""
    message = "" if error.get("message") is None else str(error["message"]).strip()
    return single_line(f"{error['type']}: {message[:limit]}" if message else error["type"])


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _gpu_list(value: Any) -> list[dict[str, Any]]:
    """A recorded GPU list; anything else (the probe's "unavailable: ...") is no GPU."""
    return [g for g in value if isinstance(g, dict)] if isinstance(value, list) else []


@dataclass(frozen=True)
class FileEntry(Section):
    """A file the run read or wrote, or one left untracked in the repository: path, size, hashes."""

    @property
    def path(self) -> str:
        return str(self.raw.get("path"))

    @property
    def size(self) -> int | None:
        return _int(self.raw.get("size"))

    @property
    def sha256(self) -> str | None:
        return _text(self.raw.get("sha256"))

    @property
    def md5(self) -> str | None:
        return _text(self.raw.get("md5"))

    @property
    def written_by(self) -> str | None:
        """The run of this checkout that wrote the file the run read (an input: as it left it)."""
        return _text(self.raw.get("written_by"))

    @property
    def stored(self) -> bool:
        return bool(self.raw.get("stored"))

    @property
    def symlink_target(self) -> str | None:
        return _text(self.raw.get("symlink_target"))


@dataclass(frozen=True)
class GitSection(Section):
    """Where the code was: the commit, the uncommitted changes as a patch, the untracked files."""

    @property
    def commit(self) -> str | None:
        return _text(self.raw.get("commit"))

    @property
    def branch(self) -> str | None:
        return _text(self.raw.get("branch"))

    @property
    def dirty(self) -> bool:
        return bool(self.raw.get("dirty"))

    @property
    def patch(self) -> Mapping[str, Any] | None:
        """The patch artifact (artifact, sha256, size), None for a clean tree."""
        patch = self.raw.get("patch")
        return patch if isinstance(patch, dict) and patch else None

    @property
    def patch_sha256(self) -> str | None:
        return _text(self.patch.get("sha256")) if self.patch else None

    @property
    def untracked(self) -> tuple[FileEntry, ...]:
        return FileEntry.each(u for u in self.raw.get("untracked") or () if isinstance(u, dict))


@dataclass(frozen=True)
class PythonSection(Section):
    """The interpreter and the installed distributions."""

    @property
    def version(self) -> str | None:
        return _text(self.raw.get("version"))

    @property
    def minor(self) -> str:
        """`3.11` of `3.11.7` ("" when unknown): what decides whether a run can run here."""
        return ".".join((self.version or "").split(".")[:2])

    @property
    def packages(self) -> dict[str, Any]:
        """Distribution name → what was recorded of it (an object with its version, or a version)."""
        packages = self.raw.get("packages")
        return dict(packages) if isinstance(packages, dict) else {}

    @property
    def package_versions(self) -> dict[str, str]:
        """Distribution name → version."""
        return {str(name): str(info.get("version") if isinstance(info, dict) else info)
                for name, info in self.packages.items()}  # fmt: skip


@dataclass(frozen=True)
class TorchSection(Section):
    """torch's build and settings; only `version` when the run's child could not probe it."""

    @property
    def version(self) -> str | None:
        return _text(self.raw.get("version")) or None

    @property
    def cuda(self) -> str | None:
        return _text(self.raw.get("cuda")) or None

    @property
    def num_threads(self) -> int | None:
        return _int(self.raw.get("num_threads"))

    @property
    def probed(self) -> bool:
        """Whether the stack was read from an imported torch (more than the installed version)."""
        return bool(set(self.raw) - {"version", "probed"})

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return _gpu_list(self.raw.get("gpus"))


@dataclass(frozen=True)
class HardwareSection(Section):
    """The machine: OS, CPU, memory, GPUs as the driver sees them."""

    def _part(self, name: str) -> Mapping[str, Any]:
        part = self.raw.get(name)
        return part if isinstance(part, dict) else {}

    @property
    def hostname(self) -> str | None:
        return _text(self.raw.get("hostname"))

    @property
    def memory_mb(self) -> int | None:
        return _int(self.raw.get("memory_mb"))

    @property
    def cpu_model(self) -> str | None:
        return _text(self._part("cpu").get("model"))

    @property
    def cpu_count(self) -> int | None:
        return _int(self._part("cpu").get("count"))

    @property
    def os_release(self) -> str | None:
        return _text(self._part("os").get("release"))

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return _gpu_list(self.raw.get("gpus"))


@dataclass(frozen=True)
class ContainerSection(Section):
    """The image the run ran in (`cascade run --docker`), or what says it ran in a container."""

    @property
    def image(self) -> str | None:
        return _text(self.raw.get("image"))

    @property
    def image_id(self) -> str | None:
        return _text(self.raw.get("image_id"))

    @property
    def in_docker(self) -> bool:
        """Run by `cascade run --docker` (its Python and packages come along in the image)."""
        return self.raw.get("runtime") == "docker"

    @property
    def shm_size(self) -> str | None:
        return _text(self.raw.get("shm_size")) or None


@dataclass(frozen=True)
class DataEntry(FileEntry):
    """A DVC-tracked path the run read: the pointer's md5 and, where it differed, the workspace's."""

    @property
    def matches(self) -> bool:
        return bool(self.raw.get("matches"))

    @property
    def object_md5(self) -> str | None:
        """The md5 of the bytes the run read: a file's, or a directory's `.dir` object (its listing of
        files). None for unknown bytes: a missing path, or a modified directory in a record made before
        cascade committed those ("note": "not restorable: a modified directory")."""
        md5 = self.raw.get("workspace_md5") or (self.raw.get("md5") if self.matches else None)
        return str(md5) if md5 else None


@dataclass(frozen=True)
class CheckpointEntry(FileEntry):
    """A checkpoint the run saved: kept in the DVC cache, or why not."""

    @property
    def status(self) -> str | None:
        return _text(self.raw.get("status"))

    @property
    def kept(self) -> bool:
        """In the DVC cache, with the md5 to fetch it by."""
        return self.status == "kept" and bool(self.raw.get("md5"))

    @property
    def step(self) -> int | None:
        return _int(self.raw.get("step"))

    @property
    def when(self) -> str:
        """"step N", or for a save before the run's first optimizer step (a resumed run's first save)
        "before step 0"."""
        return f"step {self.step}" if self.step is not None else "before step 0"

    @property
    def metrics(self) -> dict[str, Any]:
        metrics = self.raw.get("metrics")
        return dict(metrics) if isinstance(metrics, dict) else {}

    @property
    def monitor(self) -> str | None:
        return _text(self.raw.get("monitor")) or None

    @property
    def mode(self) -> str:
        return str(self.raw.get("mode") or "min")

    @property
    def files(self) -> int | None:
        return _int(self.raw.get("files"))


@dataclass(frozen=True)
class Outcome(Section):
    """How the script ended: status, exit code or signal, times, what the recording missed."""

    @property
    def status(self) -> str | None:
        return _text(self.raw.get("status"))

    @property
    def exit_code(self) -> int | None:
        return _int(self.raw.get("exit_code"))

    @property
    def read_outside(self) -> tuple[list[str], int]:
        """Files the script read outside the repository (named, never hashed): the paths the record
        names (the first 20) and how many there were."""
        far = self.raw.get("read_outside")
        listed = far.get("paths") if isinstance(far, dict) else None
        paths = [p for p in listed if isinstance(p, str)] if isinstance(listed, list) else []
        count = far.get("count") if isinstance(far, dict) else None
        if isinstance(count, int) and not isinstance(count, bool) and count >= len(paths):
            return paths, count
        return paths, len(paths)

    @property
    def signal(self) -> int | None:
        """A signal the run got from outside (Ctrl-C, SIGTERM), whatever the script then did with it."""
        return _int(self.raw.get("signal"))

    @property
    def start_time(self) -> float | None:
        value = self.raw.get("start_time")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def missing(self) -> list[str]:
        return [str(m) for m in self.raw.get("missing") or []]
