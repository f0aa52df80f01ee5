"""The field catalogue: every field of a run record that the one comparator (`record_compare`) and
`cascade diff` compare, with its section, its class, the cause it belongs to and how it is shown.

Classes (docs/architecture.md, "what decides bitwise results"): A, bitwise equality is impossible
across the change; B, it should not differ in a faithful rerun (a likely root cause); C,
informational; R, a result (metrics, checkpoints, the trace), shown by `diff` only. The kind is the
unit `verify` names a cause in. A key ending in `*` is a family (`flags.*`: every determinism flag);
an exact key wins over a family. tests/unit/test_catalogue.py pins that the comparator produces
every field listed here and nothing that is not.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    section: str
    key: str  # the compared key, or a family ending in "*"
    klass: str  # A, B, C or R
    kind: str  # the cause it belongs to: torch, gpu, params, seed, code, environment, ...
    source: str  # where the record holds it
    shown: str = "value"  # how a value is shown: value, or hash (its first 12 characters)


# The torch stack: class A (another build computes other bits), except the thread counts (class B:
# restore sets them as recorded).
TORCH_CLASS_A = (
    "version", "git_version", "cuda", "hip", "cudnn", "nccl", "cpu_capability", "mkl_version",
    "onednn_version", "debug", "cxx_abi",
)  # fmt: skip
TORCH_CLASS_B = ("num_threads", "num_interop_threads")
# Installed packages that cannot change results. torch is compared in the stack, with its build.
TOOLING_PACKAGES = ("cascade-repro", "pip", "setuptools", "wheel")
CONTAINER_FIELDS = ("image", "image_id", "repo_digest", "dockerfile_sha256")

FIELDS: tuple[Field, ...] = (
    *(Field("stack", f"torch.{k}", "A", "torch", f"torch.{k}") for k in TORCH_CLASS_A),
    *(Field("stack", f"torch.{k}", "B", "threads", f"torch.{k}") for k in TORCH_CLASS_B),
    Field("stack", "gpus", "A", "gpu", "torch.gpus, else hardware.gpus: their names"),
    Field("stack", "cpu.model", "A", "cpu", "hardware.cpu.model"),
    Field("stack", "python", "A", "python", "python.version"),
    Field("stack", "world_size", "A", "world_size", "distributed.world_size (1: one process)"),
    Field("stack", "nnodes", "A", "nnodes", "distributed.nnodes (1: one machine)"),
    Field("code", "commit", "B", "code", "git.commit", "hash"),
    Field("code", "patch", "B", "code", "git.patch.sha256", "hash"),
    Field("code", "script", "B", "command", "command.script"),
    Field("code", "module", "B", "command", "command.module (`-m NAME`; none: a script)"),
    Field("code", "argv", "B", "command", "command.argv"),
    Field("code", "untracked:*", "B", "code", "git.untracked[].sha256", "hash"),
    Field("params", "*", "B", "params", "params.values, flattened (the seed is the seed section's)"),
    Field("seed", "seed", "B", "seed", "params.seed (class C where the script's own seeds took over)"),
    Field("seed", "script_seeds", "B", "seed", "determinism.script_seeds"),
    Field("seed", "determinism.mode", "B", "determinism", "determinism.mode"),
    Field("seed", "flags.*", "B", "determinism", "determinism.flags_at_start"),
    Field("seed", "script_flags.*", "B", "determinism", "torch.flags where the script changed them"),
    *(Field("packages", name, "C", "packages", f"python.packages.{name}") for name in TOOLING_PACKAGES),
    Field("packages", "*", "B", "packages", "python.packages: versions"),
    Field("environment", "*", "B", "environment", "environment (allow-listed, redacted)"),
    Field(
        "environment",
        "read:*",
        "B",
        "environment_read",
        "environment_read (class C where one run only read it)",
    ),  # fmt: skip
    Field("data", "*", "B", "data", "data[].md5 (as read), inputs[].sha256", "hash"),
    *(Field("container", k, "B", "image", f"container.{k}") for k in CONTAINER_FIELDS),
    Field("machine", "hostname", "C", "machine", "hardware.hostname"),
    Field("machine", "memory_mb", "C", "machine", "hardware.memory_mb"),
    Field("machine", "cpu.count", "C", "machine", "hardware.cpu.count"),
    Field("machine", "os", "C", "machine", "hardware.os.release"),
    Field("metrics", "*", "R", "results", "metrics.keys: last and min of each"),
    Field("checkpoints", "*", "R", "results", "checkpoints[] kept: md5 by path", "hash"),
    Field("trace", "first divergence", "R", "results", "the traces, compared"),
)

_EXACT = {(f.section, f.key): f for f in FIELDS if not f.key.endswith("*")}
_FAMILIES = sorted((f for f in FIELDS if f.key.endswith("*")), key=lambda f: -len(f.key))


def lookup(section: str, key: str) -> Field:
    """The catalogue's entry for a compared key: exact first, then the longest family it belongs to.

    >>> lookup("seed", "flags.cudnn.benchmark").kind
    'determinism'
    """
    found = _EXACT.get((section, key))
    if found is not None:
        return found
    for family in _FAMILIES:
        if family.section == section and key.startswith(family.key[:-1]):
            return family
    raise KeyError(f"{section}.{key} is not in the field catalogue (determinism/catalogue.py)")


def shown(section: str, key: str, value: object) -> object:
    """A value as the catalogue says to show it (a hash by its first 12 characters)."""
    try:
        field = lookup(section, key)
    except KeyError:
        return value
    if field.shown == "hash" and isinstance(value, str) and len(value) > 12:
        return value[:12]
    return value
