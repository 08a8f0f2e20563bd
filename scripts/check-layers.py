#!/usr/bin/env python3
"""Checks that the C tree stands in layers: a file includes headers of its
own folder and of the folders below it, never of one above it or beside it.

The folders, from the ground up (docs/architecture.md, "Rooms of the tree"):
  proto (and its include root, the shared contracts) < common
  < daemon | client (side by side: neither may include the other)
  < exporter < cli | cmd
Inside daemon/ its layers are folders too, each above the one before
(docs/architecture.md, "Layers of the daemon"):
  base < backend < device < replay < sessions < requests < daemon/ itself
A daemon file includes its own layer's headers and those of the layers
below; a file in a daemon folder that is not a layer is an offence, as is
a bare include of another layer's header (spell it from the top of the
tree, "daemon/<layer>/<name>.h").
Tests, benches and the fuzz harnesses may include anything and are not
checked. Also refuses an include that climbs out of its folder with "../"
(a header of another folder is spelled from the top of the tree, a
contract as "graphd/<name>.h"). Prints each offence and exits 1; exits 0
when there is none. Run from anywhere in the tree.

--self-test checks the checker: it writes a small tree with known
offences into a temporary folder and exits 0 only when exactly those are
found, and none in the same tree without them."""
import os
import re
import subprocess
import sys
import tempfile

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
# The daemon's layers, from the ground up; "" is daemon/ itself, the top.
DAEMON_LAYERS = ["base", "backend", "device", "replay", "sessions", "requests", ""]
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


def daemon_layer(path):
    """The layer of a path under daemon/ ("" for daemon/ itself), or None
    when it lies in a folder that is not a layer."""
    parts = path.split("/")
    if len(parts) == 2:
        return ""
    return parts[1] if parts[1] in DAEMON_LAYERS else None


def layer_name(layer):
    return f"daemon/{layer}/" if layer else "daemon/"


def check_daemon_file(f, includes, daemon_files, by_name):
    """The offences of one daemon file against the daemon's layers
    (by_name: the daemon's files by their base names)."""
    bad = []
    mine = daemon_layer(f)
    if mine is None:
        return [f"{f}: daemon/{f.split('/')[1]}/ is not one of the daemon's layers "
                f"({', '.join(layer_name(x) for x in DAEMON_LAYERS)})"]
    here = os.path.dirname(f)
    for inc in includes:
        if "/" not in inc:
            if os.path.join(here, inc) in daemon_files:
                continue  # its own layer's header
            elsewhere = by_name.get(inc)
            if elsewhere:
                bad.append(f"{f}: #include \"{inc}\" is {elsewhere[0]}, not of its own folder: "
                           f"spell it from the top of the tree")
            continue  # a generated or system header
        if not inc.startswith("daemon/") or inc not in daemon_files:
            continue
        theirs = daemon_layer(inc)
        if theirs is None:
            continue  # reported at that file
        if DAEMON_LAYERS.index(theirs) > DAEMON_LAYERS.index(mine):
            bad.append(f"{f}: #include \"{inc}\": {layer_name(mine)} stands below "
                       f"{layer_name(theirs)}")
    return bad


def check(root, files):
    """Every offence in `files` (paths from root) against the layers."""
    daemon_files = {f for f in files if f.startswith("daemon/")}
    by_name = {}
    for g in sorted(daemon_files):
        by_name.setdefault(os.path.basename(g), []).append(g)
    bad = []
    for f in files:
        top = f.split("/")[0]
        if top not in MAY_USE:
            continue
        with open(os.path.join(root, f)) as fh:
            includes = INCLUDE.findall(fh.read())
        for inc in includes:
            if inc.startswith("../"):
                bad.append(f"{f}: #include \"{inc}\" climbs out of its folder; spell it from the top")
                continue
            if "/" not in inc or inc.startswith("graphd/") and top in ("proto", "client") \
                    and os.path.exists(os.path.join(root, top, "include", inc)):
                continue  # its own folder's header
            used = folder_of_header(inc, root)
            if used and used != top and used not in MAY_USE[top]:
                bad.append(f"{f}: #include \"{inc}\": {top}/ stands below or beside {used}/")
        if top == "daemon":
            bad += check_daemon_file(f, [i for i in includes if not i.startswith("../")],
                                     daemon_files, by_name)
    return bad


# The self-test's tree: each file's includes, and the offences it must give.
FAKE_TREE = {
    "proto/include/graphd/status.h": [],
    "common/log.h": ["graphd/status.h"],
    "daemon/base/clock.h": ["common/log.h"],
    "daemon/backend/backend.h": ["daemon/base/clock.h"],
    "daemon/device/capture.h": ["daemon/backend/backend.h", "daemon/base/clock.h"],
    "daemon/device/capture.c": ["capture.h", "version.h"],
    "daemon/replay/execute.h": ["daemon/device/capture.h"],
    "daemon/sessions/session.h": ["daemon/replay/execute.h"],
    "daemon/requests/router.h": ["daemon/sessions/session.h"],
    "daemon/server.h": ["daemon/requests/router.h", "daemon/device/capture.h"],
    "cmd/main.c": ["daemon/server.h"],
}
OFFENDERS = {
    # a lower layer reaching up, one step and many
    "daemon/backend/cuda.c": (["daemon/device/capture.h"],
                              "daemon/backend/ stands below daemon/device/"),
    "daemon/device/evict.c": (["daemon/server.h"], "daemon/device/ stands below daemon/"),
    "daemon/sessions/region.c": (["daemon/requests/router.h"],
                                 "daemon/sessions/ stands below daemon/requests/"),
    # a folder that is no layer
    "daemon/misc/odd.c": (["daemon/base/clock.h"],
                          "daemon/misc/ is not one of the daemon's layers"),
    # another layer's header by its bare name
    "daemon/replay/ring.c": (["capture.h"], "not of its own folder"),
    # the top-level rule still holds
    "common/bad.c": (["daemon/base/clock.h"], "common/ stands below or beside daemon/"),
}


def self_test():
    def write(root, tree):
        for path, incs in tree.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as fh:
                fh.write("".join(f'#include "{i}"\n' for i in incs))

    failures = []
    with tempfile.TemporaryDirectory() as root:
        write(root, FAKE_TREE)
        clean = check(root, sorted(FAKE_TREE))
        if clean:
            failures.append("a tree without offences gave:\n    " + "\n    ".join(clean))
        write(root, {p: incs for p, (incs, _) in OFFENDERS.items()})
        found = check(root, sorted(FAKE_TREE) + sorted(OFFENDERS))
        for path, (_, why) in OFFENDERS.items():
            hits = [b for b in found if b.startswith(path + ":") and why in b]
            if len(hits) != 1:
                failures.append(f"{path}: wanted one offence saying \"{why}\", got {len(hits)}")
        extra = [b for b in found if b.split(":")[0] not in OFFENDERS]
        if extra:
            failures.append("offences where there are none:\n    " + "\n    ".join(extra))
    if failures:
        print("check-layers --self-test: FAILED")
        print("\n".join("  " + f for f in failures))
        return 1
    print(f"check-layers --self-test: {len(OFFENDERS)} planted offences found, "
          f"none in the clean tree")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if sys.argv[1:]:
        print("usage: scripts/check-layers.py [--self-test]", file=sys.stderr)
        return 2
    root = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True,
                                   cwd=os.path.dirname(os.path.abspath(__file__))).strip()
    files = subprocess.check_output(["git", "ls-files", "*.c", "*.h", "*.cu"], text=True,
                                    cwd=root).split()
    bad = check(root, files)
    if bad:
        print("check-layers: includes against the layers:")
        print("\n".join("  " + b for b in bad))
        return 1
    print(f"check-layers: {len(files)} C files, every include points down, "
          f"in daemon/ too ({' < '.join(layer_name(x) for x in DAEMON_LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
