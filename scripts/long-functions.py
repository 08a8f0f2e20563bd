#!/usr/bin/env python3
"""Lists the C functions longer than a bound, from their first signature
line to their closing brace.

It reads the sources as text, relying on the tree's clang-format style: a
function definition's opening brace ends a line of its signature, and its
closing brace stands alone at the start of a line. Strings, character
constants and comments are skipped when braces are counted.

Usage: scripts/long-functions.py [--max N] [--check] PATH...
  PATH     a .c file or a folder (its .c files, recursively)
  --max N  the bound in lines (default 100)
  --check  exit 1 when any function is over it (default: only list)"""

import argparse
import os
import re
import sys



def sources(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in sorted(files):
                    if f.endswith(".c"):
                        yield os.path.join(root, f)
        else:
            yield p


def strip_code(text):
    """The text with strings, characters and comments blanked out, line
    breaks kept, so that braces count and line numbers stay true."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            closed = j < n and text[j] == c
            out.append(c + " " * (min(j, n) - i - 1) + (c if closed else ""))
            i = j + 1 if closed else j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """[(name, first line, last line)] of the function definitions in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_code(f.read())
    # Preprocessor lines are no part of any declaration's head.
    text = re.sub(r"(?m)^#(?:[^\n]*\\\n)*[^\n]*$", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    found, depth, head_at, line, opened = [], 0, 0, 1, None
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            if depth == 0:
                opened = (head_at, line)
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and opened is not None:
                at, _ = opened
                head = text[at:text.index("{", at)]
                m = re.search(r"(\w+)\s*\(", head)
                if m and head.rstrip().endswith(")") and "=" not in head.split("(")[0]:
                    lead = head[:len(head) - len(head.lstrip())]
                    first = text[:at].count("\n") + 1 + lead.count("\n")
                    found.append((m.group(1), first, line))
                opened = None
                head_at = i + 1
        elif c == ";" and depth == 0:
            head_at = i + 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=100)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    over = []
    for path in sources(args.paths):
        for name, first, last in functions(path):
            n = last - first + 1
            if n > args.max:
                over.append((n, path, first, name))
    for n, path, first, name in sorted(over, key=lambda o: (o[1], o[2])):
        print(f"{path}:{first}: {name}: {n} lines")
    if not over:
        print(f"long-functions: none over {args.max} lines")
    return 1 if over and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
