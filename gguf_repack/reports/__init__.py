"""Machine-readable reports of convert, verify and export, for CI pipelines.

One report per command run: a suite per output directory, a case per check (a tensor, a
source file's header, a rebuilt source file), each passed, failed (with the reason) or an
error (the input could not be read at all). Written as JSON (`report.schema.json` beside this
file, versioned) or as JUnit XML (junit.py), chosen by the file's extension, atomically, also
when the check fails or the input is unreadable.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gguf_repack import __version__
from gguf_repack.errors import OutputError

SCHEMA = "gguf-repack-report"
SCHEMA_VERSION = 1
PASSED, FAILED, ERROR = "passed", "failed", "error"
FORMATS = (".json", ".xml")


@dataclass
class Case:
    kind: str  # "tensor" | "header" | "file" | "output"
    name: str
    status: str = PASSED
    reason: str | None = None
    type: str | None = None
    shape: list[int] | None = None
    checksum: dict | None = None  # {"algorithm", "expected", "found"}


@dataclass
class Suite:
    """One output directory: its source files and its checks."""

    path: str
    source: str | None = None  # what it was converted from or compared against
    files: list[dict] = field(default_factory=list)  # name, size, sha256, origin
    cases: list[Case] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def status(self) -> str:
        statuses = {c.status for c in self.cases}
        return ERROR if ERROR in statuses else FAILED if FAILED in statuses else PASSED


@dataclass
class Report:
    command: str
    suites: list[Suite] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    @property
    def status(self) -> str:
        statuses = {s.status for s in self.suites}
        return ERROR if ERROR in statuses else FAILED if FAILED in statuses else PASSED

    def totals(self) -> dict:
        cases = [c for s in self.suites for c in s.cases]
        return {"outputs": len(self.suites), "cases": len(cases),
                **{status: sum(c.status == status for c in cases)
                   for status in (PASSED, FAILED, ERROR)}}

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "tool": {"name": "gguf-repack", "version": __version__},
            "command": self.command,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "status": self.status,
            "totals": self.totals(),
            "outputs": [{"path": s.path, "source": s.source, "status": s.status,
                         "seconds": round(s.seconds, 3), "files": s.files,
                         "cases": [{k: v for k, v in asdict(c).items() if v is not None}
                                   for c in s.cases]} for s in self.suites],
        }

    def write(self, path: str | os.PathLike) -> None:
        """To `path`, as its extension says (.json or .xml), atomically: a temporary sibling
        renamed into place, so a reader never sees half a report."""
        path = Path(path)
        if path.suffix.lower() == ".json":
            text = json.dumps(self.to_json(), indent=1) + "\n"
        elif path.suffix.lower() == ".xml":
            from .junit import junit_xml

            text = junit_xml(self)
        else:
            raise OutputError(f"{path}: a report is .json or .xml (JUnit)")
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def check_report_paths(paths) -> list[Path]:
    """Refuse a report path that cannot be written before any work is done."""
    out = []
    for p in map(Path, paths):
        if p.suffix.lower() not in FORMATS:
            raise OutputError(f"{p}: a report is .json or .xml (JUnit)")
        if not p.parent.is_dir():
            raise OutputError(f"{p}: directory {p.parent} does not exist")
        out.append(p)
    return out


def source_files(sources: list[dict]) -> list[dict]:
    """A manifest's source records as a report lists them."""
    return [{"name": s.get("file"), "size": s.get("size"), "sha256": s.get("sha256"),
             "origin": s.get("origin")} for s in sources]


def error_suite(path: str, message: str) -> Suite:
    """An input that could not be read at all: one error case."""
    return Suite(str(path), cases=[Case("output", str(path), ERROR, message)])


def from_verify(report, against: str | None, seconds: float) -> Suite:
    """A suite from converter.rebuild.VerifyReport."""
    suite = Suite(str(report.path), against, source_files(report.sources), seconds=seconds)
    for c in report.checks:
        checksum = ({"algorithm": c.algorithm, "expected": c.expected, "found": c.found}
                    if c.algorithm else None)
        suite.cases.append(Case(c.kind, c.name, c.status, c.reason, c.type, c.shape, checksum))
    for problem in report.problems:
        suite.cases.append(Case("output", str(report.path), FAILED, problem))
    return suite


def from_output(out: str | os.PathLike, source: str | None, seconds: float) -> Suite:
    """A suite of what convert wrote: each tensor with the checksum it recorded."""
    from gguf_repack.format.manifest import TensorRecord, read_manifest

    manifest = read_manifest(out)
    suite = Suite(str(out), source, source_files(manifest["sources"]), seconds=seconds)
    for s in manifest["sources"]:
        origin = s.get("origin")
        if origin:  # a download, checked against the Hub's sha256 before it was converted
            suite.cases.append(Case("file", s["file"], checksum={
                "algorithm": "sha256", "expected": origin.get("sha256"), "found": s["sha256"]}))
    for record in manifest["tensors"]:
        t = TensorRecord.from_json(record)
        algorithm, digest = t.checksum()
        suite.cases.append(Case("tensor", t.name, type=t.type, shape=list(t.shape),
                                checksum={"algorithm": algorithm, "expected": None,
                                          "found": digest}))
    return suite
