"""What the Warp scan benches (warp_scan_bench.py, mjx_scan_bench.py)
share: their --modes and --warp-modes lists, imports that exit 2 with what
to do, and the daemon's captures printed at the end."""

import sys


def mode_list(ap, flag, value, allowed, upper=False, none=True):
    """The comma-separated names of `flag` (with `none`, 'none' for no
    names), each one of `allowed`; a bad one ends the program through
    ap.error."""
    if none and value == "none":
        return []
    modes = [m.strip().upper() if upper else m.strip() for m in value.split(",") if m.strip()]
    for m in modes:
        if m not in allowed:
            ap.error(f"{flag}: {m!r} is not one of {', '.join(allowed)}")
    return modes


def need(prog, what, hint):
    """Imports a prerequisite, or exits 2 with what to do."""
    try:
        return __import__(what)
    except Exception as e:  # noqa: BLE001: any import failure
        print(f"{prog}: cannot import {what} ({e}); {hint}", file=sys.stderr)
        sys.exit(2)


def print_captures(prog, socket):
    """A FIGURE line for each capture the daemon on `socket` holds."""
    import graphd
    try:
        with graphd.Client.connect(socket) as c:
            for cap in c.list_captures():
                print(f"FIGURE capture of program {cap['program'][:16]} device {cap['device']} mode "
                      f"{cap['mode']}: {cap['replays']} replays, {cap['nodes']} nodes, {cap['graphs']} "
                      f"executable graphs, {cap['repoints']} node parameters updated for moved buffers")
    except Exception as e:  # noqa: BLE001: the figures above stand
        print(f"{prog}: cannot list the daemon's captures: {e}", file=sys.stderr)
