#!/usr/bin/python3
"""Turns the libFuzzer runs of tests/fuzz/run-fuzz.sh into one JUnit XML file.

Usage: fuzz_junit.py OUT.xml WORKDIR NAME...  where WORKDIR/NAME/ holds the
run's log (libFuzzer's output) and status (its exit code). One test case per
harness: it fails when the run exited non-zero (a crash, a leak, a timeout,
an out-of-memory, a broken rule of the harness) or left no status (it did not
run). Prints one line per harness; exit status 0 only when every one passed.
"""

import os
import re
import sys
import xml.etree.ElementTree as ET

REPORT = re.compile(r"ERROR: |runtime error: |broken rule: |SUMMARY: ")
ARTIFACT = re.compile(r"Test unit written to (\S+)")
PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)")
STAT = re.compile(r"^stat::(\w+):\s+(\d+)")
DONE = re.compile(r"^Done (\d+) runs in (\d+) second")


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def figures(log):
    """Executions, speed, coverage and corpus size from libFuzzer's output."""
    fig = {}
    for line in log.splitlines():
        m = PROGRESS.match(line)
        if m:
            fig.update(zip(("runs", "cov", "ft", "corpus"), map(int, m.groups())))
        m = STAT.match(line)
        if m:
            fig[m.group(1)] = int(m.group(2))
        m = DONE.match(line)
        if m:
            fig["seconds"] = int(m.group(2))
    return fig


def case(suite, work, name):
    tc = ET.SubElement(suite, "testcase", classname="fuzz", name="fuzz_" + name)
    log, status = read(os.path.join(work, name, "log")), read(os.path.join(work, name, "status"))
    if log is None or status is None:
        ET.SubElement(tc, "failure", message="did not run (build failed?)")
        return False, f"fuzz_{name}: did not run"
    fig = figures(log)
    tc.set("time", str(fig.get("seconds", 0)))
    summary = (f"{fig.get('number_of_executed_units', fig.get('runs', 0))} runs, "
               f"{fig.get('average_exec_per_sec', 0)}/s, cov {fig.get('cov', 0)}, "
               f"ft {fig.get('ft', 0)}, corpus {fig.get('corpus', 0)}")
    ET.SubElement(tc, "system-out").text = summary
    if status.strip() == "0":
        return True, f"fuzz_{name}: ok, {summary}"
    lines = [ln for ln in log.splitlines() if ln.strip()] or ["exit " + status.strip()]
    first = next((ln for ln in lines if REPORT.search(ln)), lines[-1])
    artifact = ARTIFACT.search(log)
    where = artifact.group(1) if artifact else os.path.join(work, name, "log")
    fail = ET.SubElement(tc, "failure", message=f"{first.strip()} (input: {where})")
    fail.text = "\n".join(log.splitlines()[-80:])
    return False, f"fuzz_{name}: FAILED: {first.strip()}\n  input: {where}\n  log: " + \
        os.path.join(work, name, "log")


def main(out, work, names):
    suite = ET.Element("testsuite", name="fuzz")
    ok = True
    for name in names:
        passed, line = case(suite, work, name)
        ok = ok and passed
        print(line)
    suite.set("tests", str(len(names)))
    suite.set("failures", str(sum(tc.find("failure") is not None for tc in suite)))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
