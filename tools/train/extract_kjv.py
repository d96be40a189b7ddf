#!/usr/bin/env python3
"""Extract the King James Bible as plain text (one verse per line).

Requires the Debian package `bible-kjv-text` (provides the `bible` program).
Usage: extract_kjv.py OUTPUT_PATH
"""
import re
import subprocess
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: extract_kjv.py OUTPUT_PATH")
    raw = subprocess.run(["bible", "-l100000", "gen1:1-rev22:21"],
                         check=True, capture_output=True, text=True).stdout
    verse = re.compile(r"^\s*\d+ (.*\S)\s*$")
    out = []
    for line in raw.splitlines():
        m = verse.match(line)
        if m:  # book/chapter headings and blank lines are dropped
            out.append(m.group(1))
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {len(out)} verses to {sys.argv[1]}")


if __name__ == "__main__":
    main()
