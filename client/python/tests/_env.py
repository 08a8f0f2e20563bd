"""Paths the tests need, from the environment CTest sets (GRAPHD_LIB,
GRAPHD_BIN, GRAPHD_HOST_KERNELS, GRAPHD_ABI_SIZES). Outside CTest a test
whose path is unset is skipped; under CTest (GRAPHD_TEST_STRICT=1) it fails
instead, so a broken setup never passes as a skip.

With GRAPHD_TEST_INSTALLED=1 the tests run against an installed wheel:
libgraphd and libgraphd_xla are the package's own (next to graphd/), found
by the package itself, and $GRAPHD_LIB / $GRAPHD_XLA_LIB must not be set."""

import os
import unittest

INSTALLED = os.environ.get("GRAPHD_TEST_INSTALLED") == "1"
_PACKAGE_LIBS = {"GRAPHD_LIB": "libgraphd.so", "GRAPHD_XLA_LIB": "libgraphd_xla.so"}


def path(test, var):
    if INSTALLED and var in _PACKAGE_LIBS:
        if os.environ.get(var):
            test.fail(f"${var} is set: an installed package must find its own libraries")
        import graphd
        p = os.path.join(os.path.dirname(os.path.abspath(graphd.__file__)), _PACKAGE_LIBS[var])
        if not os.path.exists(p):
            test.fail(f"the installed package has no {_PACKAGE_LIBS[var]}")
        return p
    p = os.environ.get(var)
    strict = os.environ.get("GRAPHD_TEST_STRICT") == "1"
    if not p:
        if strict:
            test.fail(f"${var} is not set")
        raise unittest.SkipTest(f"${var} is not set")
    if not os.path.exists(p):
        test.fail(f"${var}={p} does not exist")
    return p
