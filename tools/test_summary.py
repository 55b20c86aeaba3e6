#!/usr/bin/env python3
"""Count one cargo-nextest run for tools/test.sh: passed, failed and skipped tests.

Reads the run's JUnit report (each test's captured output is kept, `.config/nextest.toml`) and the run's log
(nextest's `Summary` line, for the tests it skipped itself: `#[ignore]`d ones). A test that printed a line
starting with `skipped:` could not run here (a missing fixture, a GPU, a toolchain): it is listed with its reason
and counted as skipped, never as passed.

    test_summary.py JUNIT_XML LOG [--filtered]  ->  prints the skip list, then `counts: P F S`

With --filtered (a run narrowed by a filterset) nextest's own skip count also holds the tests filtered out, so
it is not added.
"""
import re
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    junit, log = sys.argv[1], sys.argv[2]
    passed = failed = skipped = 0
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"test_summary: cannot read {junit}: {e}", file=sys.stderr)
        print("counts: 0 1 0")
        return 0
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            name = f"{suite.get('name')} {case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                continue
            if case.find("skipped") is not None:
                skipped += 1
                continue
            out = "".join((e.text or "") for tag in ("system-out", "system-err") for e in case.iter(tag))
            reasons = [line.strip() for line in out.splitlines() if line.strip().startswith("skipped:")]
            if reasons:
                skipped += 1
                print(f"skipped: {name}: {reasons[0][len('skipped:'):].strip()}")
            else:
                passed += 1
    # Tests nextest did not run at all (#[ignore]) appear only in its summary line.
    text = open(log, encoding="utf-8", errors="replace").read()
    m = None
    for m in re.finditer(r"Summary \[.*?\]\s+\d+ tests? run:.*?(?:(\d+) skipped)?\s*$", text, re.M):
        pass
    if m and m.group(1) and "--filtered" not in sys.argv[3:]:
        skipped += int(m.group(1))
    print(f"counts: {passed} {failed} {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
