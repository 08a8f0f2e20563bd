"""The wheel's console scripts, `graphd` and `graphctl`: each replaces its
own process with the binary of that name that the wheel carries in
graphd/_bin, with the same arguments. Being an exec, the daemon keeps the
process id, the signals and the exit status a service manager sees.

A wheel built with GRAPHD_CLIENT_ONLY carries no binaries: the scripts
then say so and exit with status 1."""

import os
import sys
from typing import NoReturn

BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")


def binary(name: str) -> str:
    """The path of a binary the wheel carries.

    Parameters
    ----------
    name : str
        "graphd" or "graphctl".

    Returns
    -------
    str
        Its path in graphd/_bin (which may not exist: see run).
    """
    return os.path.join(BIN_DIR, name)


def run(name: str, args: "list[str]") -> NoReturn:
    """Replaces this process with the binary `name`, given `args`.

    Parameters
    ----------
    name : str
        "graphd" or "graphctl": also its argv[0], so that its messages
        name it as the user typed it.
    args : list of str
        The arguments after the program's name.

    Returns
    -------
    NoReturn
        Only the binary's exit ends the process; when the binary is missing
        (a client-only wheel) or cannot be run, a message goes to stderr
        and the status is 1.
    """
    path = binary(name)
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"{name}: this graphd package has no {name} binary ({path} is missing): it "
                         "was built for the client alone (GRAPHD_CLIENT_ONLY). Install the graphd wheel "
                         "that carries the daemon, or the Debian package (packaging/build-deb.sh)\n")
        sys.exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, [name] + list(args))
    except OSError as e:
        sys.stderr.write(f"{name}: cannot run {path}: {e}\n")
    sys.exit(1)


def graphd() -> NoReturn:
    """The `graphd` console script: the daemon (graphd --help)."""
    run("graphd", sys.argv[1:])


def graphctl() -> NoReturn:
    """The `graphctl` console script: the admin command (graphctl --help)."""
    run("graphctl", sys.argv[1:])
