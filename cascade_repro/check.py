"""Can this machine reproduce a recorded run? Pure: the record and a record of this machine in,
findings out: bitwise reproducible here, within tolerance only (naming the class-A fields), or not
runnable (missing GPU, CPU-only torch for a CUDA run, another Python, missing packages).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from cascade_repro.capture.packages import installable
from cascade_repro.determinism.record_compare import compare_records
from cascade_repro.errors import EXIT_ERROR, EXIT_NOT_REPRODUCED, EXIT_OK
from cascade_repro.manifest import Manifest

BITWISE = "BITWISE_REPRODUCIBLE"
MACHINE_OK, MACHINE_PROBLEMS = "OK", "PROBLEMS"  # `cascade check` without a run
TOLERANCE = "WITHIN_TOLERANCE_ONLY"
NOT_RUNNABLE = "NOT_RUNNABLE"


@dataclass(frozen=True)
class Finding:
    """One thing `cascade check` found, with its level and the fix."""

    level: str  # "not_runnable", "tolerance", "restore_fixes", "ok", "problem"
    summary: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "summary": self.summary, "fix": self.fix}


@dataclass(frozen=True)
class CheckReport:
    """`cascade check`: can this machine reproduce the run (or run cascade at all), and why not."""

    subject: str  # the run checked against, or "this machine"
    verdict: str
    findings: tuple[Finding, ...]

    @property
    def exit_status(self) -> int:
        """`cascade check`'s exit code: 0 bitwise reproducible here (or every machine check passed),
        3 within tolerance only, 1 not runnable here (or a check failed)."""
        if self.verdict in (BITWISE, MACHINE_OK):
            return EXIT_OK
        return EXIT_NOT_REPRODUCED if self.verdict == TOLERANCE else EXIT_ERROR

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "cascade.check/1", "subject": self.subject, "verdict": self.verdict,
                "findings": [f.to_dict() for f in self.findings]}  # fmt: skip


def check_against(record: Manifest, here: Manifest, more: Sequence[Finding] = ()) -> CheckReport:
    """A recorded run against this machine: what stops it, what restore fixes, what allows tolerance only
    (`more`: what the caller found beyond the two records, such as inputs the checkout lacks)."""
    findings = [*_not_runnable(record, here), *more]
    stack = compare_records(record, here, only=("stack",)).section("stack")
    for change in stack.changes:
        if change.klass == "A":
            findings.append(
                Finding("tolerance", f"{change.key}: {change.a} recorded, {change.b} here",
                        "compare within tolerance (cascade restore does), or run where the record was made")
            )  # fmt: skip
        else:
            findings.append(Finding("restore_fixes", f"{change.key}: {change.a} recorded, {change.b} here",
                                    "cascade restore sets it as recorded"))  # fmt: skip
    levels = {f.level for f in findings}
    verdict = NOT_RUNNABLE if "not_runnable" in levels else TOLERANCE if "tolerance" in levels else BITWISE
    return CheckReport(record.run_id, verdict, tuple(findings))


def _not_runnable(record: Manifest, here: Manifest) -> list[Finding]:
    out: list[Finding] = []
    torch_r, torch_h = record.torch, here.torch
    gpus_r, gpus_h = record.gpus, here.gpus
    if torch_r.version and not torch_h.version:
        out.append(Finding("not_runnable", "torch is not installed here",
                           f"pip install torch=={torch_r.version.split('+')[0]}"))  # fmt: skip
    if torch_r.cuda and torch_h.version and not torch_h.cuda:
        out.append(
            Finding("not_runnable", f"the run used a CUDA build of torch (CUDA {torch_r.cuda}); "
                    f"torch {torch_h.version} here is CPU-only",
                    f"install the CUDA build of torch {torch_r.version}")
        )  # fmt: skip
    if gpus_r and not gpus_h:
        names = ", ".join(sorted({str(g.get("name")) for g in gpus_r}))
        summary = f"the run used {len(gpus_r)} GPU(s) ({names}); none is visible here"
        fix = "run on a machine with that GPU (check CUDA_VISIBLE_DEVICES and the driver)"
        out.append(Finding("not_runnable", summary, fix))
    # A run recorded in Docker brings its Python and packages along in its image.
    in_image = f"; or rerun it in its image {record.container.image}: `cascade restore --docker`"
    in_image = in_image if record.container.in_docker else ""
    py_r, py_h = record.python, here.python
    if py_r.minor and py_h.minor and py_r.minor != py_h.minor:
        summary = f"the run used Python {py_r.version}; this is Python {py_h.version}"
        out.append(Finding("not_runnable", summary, f"use Python {py_r.minor}{in_image}"))
    packages_r, packages_h = record.python.package_versions, here.python.packages
    if packages_h:
        missing = sorted(name for name, version in packages_r.items()
                         if name not in packages_h and name != "cascade-repro" and installable(name, version))
        if missing:
            pins = " ".join(f"{n}=={packages_r[n]}" for n in missing[:8])
            summary = f"{len(missing)} package(s) of the run are not installed here: " + ", ".join(
                missing[:8]
            )
            out.append(Finding("not_runnable", summary, f"pip install {pins}{in_image}"))
    return out


def check_machine(facts: Mapping[str, Any]) -> CheckReport:
    """Sanity of this machine for cascade itself, from probes the caller ran (name → (ok, detail, fix))."""
    findings = tuple(
        Finding("ok" if ok else "problem", f"{name}: {detail}", None if ok else fix)
        for name, (ok, detail, fix) in facts.items()
    )
    verdict = MACHINE_OK if all(f.level == "ok" for f in findings) else MACHINE_PROBLEMS
    return CheckReport("this machine", verdict, findings)
