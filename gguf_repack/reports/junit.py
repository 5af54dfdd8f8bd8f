"""A report as JUnit XML, the test-result format GitHub Actions, GitLab, Jenkins and Buildkite
display: a <testsuite> per output directory, a <testcase> per check (classname: the output's
name and the kind of check; name: the tensor or file), <failure> with the reason for a failed
check, <error> for an input that could not be read."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from . import ERROR, FAILED, Report


def junit_xml(report: Report) -> str:
    totals = report.totals()
    root = ET.Element("testsuites", name=f"gguf-repack {report.command}",
                      tests=str(totals["cases"]), failures=str(totals[FAILED]),
                      errors=str(totals[ERROR]),
                      time=f"{sum(s.seconds for s in report.suites):.3f}")
    for suite in report.suites:
        cases = suite.cases
        el = ET.SubElement(root, "testsuite", name=suite.path, tests=str(len(cases)),
                           failures=str(sum(c.status == FAILED for c in cases)),
                           errors=str(sum(c.status == ERROR for c in cases)),
                           time=f"{suite.seconds:.3f}")
        props = ET.SubElement(el, "properties")
        if suite.source:
            ET.SubElement(props, "property", name="source", value=suite.source)
        for f in suite.files:
            ET.SubElement(props, "property", name=f"sha256 {f['name']}", value=str(f["sha256"]))
            if f.get("origin"):
                o = f["origin"]
                ET.SubElement(props, "property", name=f"origin {f['name']}",
                              value=f"{o['hub']}@{o['revision']}:{o['path']}")
        label = Path(suite.path).name or suite.path
        for c in cases:
            case = ET.SubElement(el, "testcase", classname=f"{label}.{c.kind}", name=c.name,
                                 time="0")
            if c.status in (FAILED, ERROR):
                detail = ET.SubElement(case, "failure" if c.status == FAILED else "error",
                                       message=c.reason or c.status, type=c.status)
                if c.checksum:
                    detail.text = (f"{c.checksum['algorithm']}: expected "
                                   f"{c.checksum['expected']}, found {c.checksum['found']}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
