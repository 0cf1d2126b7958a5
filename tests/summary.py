#!/usr/bin/python3
"""Counts every test case of a `make test` run and prints the closing line.

Usage: summary.py LABEL=FILE ...  where FILE is a meson build directory (its
meson-logs/testlog.junit.xml and testlog.json are read) or a pytest JUnit XML
file. Each cmocka case counts once (meson records TAP subtests); a test binary
that failed without a failing case (a crash, a timeout) counts as one failure.
A missing file counts as one failure: a suite that did not run is not a pass.
Exit status 0 only when something ran and nothing failed.
"""

import json
import os
import sys
import xml.etree.ElementTree as ET


def junit_counts(path):
    passed = failed = skipped = 0
    failed_suites = set()
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for case in suite.findall("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                failed_suites.add(suite.get("name", ""))
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped, failed_suites


def meson_counts(builddir):
    passed, failed, skipped, failed_suites = junit_counts(
        os.path.join(builddir, "meson-logs", "testlog.junit.xml"))
    with open(os.path.join(builddir, "meson-logs", "testlog.json")) as log:
        for line in log:
            result = json.loads(line)
            bad = result["result"] not in ("OK", "SKIP", "EXPECTEDFAIL")
            if bad and not any(s.endswith("." + result["name"]) for s in failed_suites):
                failed += 1
                print(f"  {result['name']}: {result['result']} (no failing case recorded)")
    return passed, failed, skipped


def main(args):
    total_p = total_f = total_s = 0
    for arg in args:
        label, _, path = arg.partition("=")
        try:
            if os.path.isdir(path):
                p, f, s = meson_counts(path)
            else:
                p, f, s, _ = junit_counts(path)
        except (OSError, ET.ParseError, json.JSONDecodeError) as exc:
            print(f"{label}: did not run ({exc})")
            p, f, s = 0, 1, 0
        print(f"{label}: {p} passed, {f} failed, {s} skipped")
        total_p, total_f, total_s = total_p + p, total_f + f, total_s + s
    print(f"{total_p} passed, {total_f} failed, {total_s} skipped")
    return 0 if total_f == 0 and total_p > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
