#!/usr/bin/env python3
"""Every relative link of the Markdown docs leads to a file that exists and,
with a #fragment, to a heading of that file (GitHub's anchor rules): run by
`make lint`, so that a heading renamed or a section moved cannot leave a
link pointing nowhere."""
import glob
import os
import re
import sys


def slug(heading):
    heading = heading.strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def headings(path):
    found, seen, in_code = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        anchor = slug(line.lstrip("#"))
        if anchor in seen:
            seen[anchor] += 1
            anchor = f"{anchor}-{seen[anchor]}"
        else:
            seen[anchor] = 0
        found.add(anchor)
    return found


def main():
    files = sorted(
        f
        for pattern in ("*.md", "docs/**/*.md", "rabbitmq/**/*.md", "deploy/**/*.md")
        for f in glob.glob(pattern, recursive=True)
        if "node_modules" not in f
    )
    anchors = {os.path.normpath(f): headings(f) for f in files}
    bad = 0
    for f in files:
        for match in re.finditer(r"\]\(([^)\s]+)\)", open(f, encoding="utf-8").read()):
            target = match.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else os.path.normpath(f)
            if path and not os.path.exists(resolved):
                print(f"{f}: {target}: no such file")
                bad += 1
            elif anchor and resolved in anchors and anchor not in anchors[resolved]:
                print(f"{f}: {target}: no such heading")
                bad += 1
    print(f"doc links: {len(files)} files, {bad} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
