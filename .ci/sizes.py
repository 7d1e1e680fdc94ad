#!/usr/bin/env python3
"""Checks that no source file is over MAX_FILE lines and no function over
MAX_FN lines (from its `fn` line to its closing brace, as rustfmt lays
them out).

usage: sizes.py DIR...   (every .rs file under each DIR's src/ trees)
"""
import os
import re
import sys

MAX_FILE = 1000
MAX_FN = 150
FN = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")


def check(path, problems):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if len(lines) > MAX_FILE + 1:
        problems.append(f"{path}: {len(lines) - 1} lines (at most {MAX_FILE})")
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m or line.rstrip().endswith(";"):
            continue
        indent = m.group(1)
        for j in range(i + 1, len(lines)):
            if lines[j] == indent + "}":
                if j - i + 1 > MAX_FN:
                    problems.append(f"{path}:{i + 1}: fn {m.group(2)} is {j - i + 1} lines (at most {MAX_FN})")
                break


def main():
    problems = []
    for top in sys.argv[1:]:
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d not in ("target", "fuzz", "tests")]
            if os.sep + "src" not in root + os.sep and not root.endswith("src"):
                continue
            for f in sorted(files):
                if f.endswith(".rs"):
                    check(os.path.join(root, f), problems)
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
