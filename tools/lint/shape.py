#!/usr/bin/env python3
"""The workspace's shape limits: source files over 800 lines, functions over 120 lines (outside tests and
tables), and `#[allow(clippy::…)]` without a one-line reason on the line above or beside it.

A function's length runs from its `fn` line to its closing brace (brace matching that skips strings,
chars and comments). Test code (files under tests/, `#[cfg(test)] mod` blocks, `tests.rs` files) is not
counted, nor a function marked as a table (`// shape: table` on one of the three lines above its `fn`: a list
of pinned digests, say). Prints one line per finding and exits 1 if any; `--counts` prints the totals only.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FILE_LIMIT, FN_LIMIT = 800, 120
FN_RE = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def strip(line, state):
    """The line with strings, chars and comments blanked; `state` carries a block comment or a raw string."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["block"] -= 1
            i = j + 2
            continue
        if state["raw"] is not None:
            end = '"' + "#" * state["raw"]
            j = line.find(end, i)
            if j < 0:
                return "".join(out)
            state["raw"] = None
            i = j + len(end)
            continue
        if state["str"]:
            while i < n:
                if line[i] == "\\":
                    i += 2
                    continue
                if line[i] == '"':
                    state["str"] = False
                    i += 1
                    break
                i += 1
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] += 1
            i += 2
            continue
        m = re.match(r'b?r(#*)"', line[i:])
        if m and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")):
            state["raw"] = len(m.group(1))
            i += len(m.group(0))
            continue
        if c == '"':
            state["str"] = True
            i += 1
            continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", line[i:])
            if m:
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out)


def scan(path):
    """(lines, [(name, start, length)], [allow line numbers without a reason]) of one file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    state = {"block": 0, "raw": None, "str": False}
    code = [strip(l, state) for l in lines]
    in_test = [False] * len(lines)
    depth, test_depth, pending_test = 0, None, False
    fns, stack = [], []
    for i, c in enumerate(code):
        raw = lines[i].strip()
        if raw.startswith("#[cfg(test)]"):
            pending_test = True
        if test_depth is not None:
            in_test[i] = True
        m = FN_RE.match(c)
        if m and test_depth is None:
            # A function that is a table of data says so on a comment line just above it (`// shape: table`).
            table = any("shape: table" in lines[j] for j in range(max(0, i - 3), i))
            stack.append(("" if table else m.group(7), i, depth))
        for ch in c:
            if ch == "{":
                if pending_test and test_depth is None:
                    test_depth = depth
                    in_test[i] = True
                pending_test = False
                depth += 1
            elif ch == "}":
                depth -= 1
                if stack and depth == stack[-1][2] and stack[-1][1] <= i:
                    name, start, _ = stack.pop()
                    if name:
                        fns.append((name, start + 1, i - start + 1))
                if test_depth is not None and depth == test_depth:
                    test_depth = None
            elif ch == ";" and stack and depth == stack[-1][2]:
                stack.pop()  # a declaration without a body
        if pending_test and c.strip().endswith(";"):
            pending_test = False
    allows = []
    for i, l in enumerate(lines):
        if "allow(clippy::" in l and not in_test[i]:
            before = lines[i - 1].strip() if i else ""
            if not (before.startswith("//") or "//" in l):
                allows.append(i + 1)
    return len(lines), fns, allows


def main():
    counts = "--counts" in sys.argv
    findings, nfiles, nfns, nallows, total_allows = [], 0, 0, 0, 0
    for top in ("crates",):
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x not in ("target", "tests")]
            for name in sorted(files):
                if not name.endswith(".rs") or name == "tests.rs":
                    continue
                p = os.path.join(d, name)
                rel = os.path.relpath(p, ROOT)
                n, fns, allows = scan(p)
                with open(p, encoding="utf-8") as f:
                    total_allows += f.read().count("allow(clippy::")
                if n > FILE_LIMIT:
                    nfiles += 1
                    findings.append(f"{rel}: {n} lines (limit {FILE_LIMIT})")
                for fname, start, length in fns:
                    if length > FN_LIMIT:
                        nfns += 1
                        findings.append(f"{rel}:{start}: fn {fname} is {length} lines (limit {FN_LIMIT})")
                for a in allows:
                    nallows += 1
                    findings.append(f"{rel}:{a}: clippy allow without a reason on the line above")
    if counts:
        print(f"files over {FILE_LIMIT}: {nfiles}; functions over {FN_LIMIT}: {nfns}; "
              f"clippy allows: {total_allows} ({nallows} without a reason)")
    else:
        print("\n".join(findings) if findings else "shape: every file, function and allow within the limits")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
