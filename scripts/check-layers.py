#!/usr/bin/env python3
"""Checks that the C tree stands in layers: a file includes headers of its
own folder and of the folders below it, never of one above it or beside it.

The folders, from the ground up (docs/architecture.md, "Rooms of the tree"):
  proto (and its include root, the shared contracts) < common
  < daemon | client (side by side: neither may include the other)
  < exporter < cli | cmd
Tests, benches and the fuzz harnesses may include anything and are not
checked. Also refuses an include that climbs out of its folder with "../"
(a header of another folder is spelled from the top of the tree, a
contract as "graphd/<name>.h"). Prints each offence and exits 1; exits 0
when there is none. Run from anywhere in the tree."""
import os
import re
import subprocess
import sys

# What each folder may include besides its own files.
MAY_USE = {
    "proto": set(),
    "common": {"proto"},
    "daemon": {"proto", "common"},
    "client": {"proto", "common"},
    "exporter": {"proto", "common", "client"},
    "cli": {"proto", "common", "client", "exporter"},
    "cmd": {"proto", "common", "daemon", "client", "exporter"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of_header(path, root):
    """The top-level folder a quoted include resolves to, or None when it
    is not a header of the tree (a generated or system one)."""
    if path.startswith("graphd/"):
        for where in ("proto/include", "client/include"):
            if os.path.exists(os.path.join(root, where, path)):
                return where.split("/")[0]
        return None
    top = path.split("/")[0]
    return top if top in MAY_USE and os.path.exists(os.path.join(root, path)) else None


def main():
    root = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True,
                                   cwd=os.path.dirname(os.path.abspath(__file__))).strip()
    files = subprocess.check_output(["git", "ls-files", "*.c", "*.h", "*.cu"], text=True,
                                    cwd=root).split()
    bad = []
    for f in files:
        top = f.split("/")[0]
        if top not in MAY_USE:
            continue
        with open(os.path.join(root, f)) as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            if inc.startswith("../"):
                bad.append(f"{f}: #include \"{inc}\" climbs out of its folder; spell it from the top")
                continue
            if "/" not in inc or inc.startswith("graphd/") and top in ("proto", "client") \
                    and os.path.exists(os.path.join(root, top, "include", inc)):
                continue  # its own folder's header
            used = folder_of_header(inc, root)
            if used and used != top and used not in MAY_USE[top]:
                bad.append(f"{f}: #include \"{inc}\": {top}/ stands below or beside {used}/")
    if bad:
        print("check-layers: includes against the layers:")
        print("\n".join("  " + b for b in bad))
        return 1
    print(f"check-layers: {len(files)} C files, every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
