"""The one place graphd's version is written: the Python package's
__version__, the wheel's version (pyproject.toml reads it) and the C
project's (CMakeLists.txt reads it into project(VERSION): libgraphd's
SONAME, graphd/version.h, the Debian package). Change it here only."""

__version__ = "0.1.0"
