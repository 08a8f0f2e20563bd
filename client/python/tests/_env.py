"""Paths the tests need, from the environment CTest sets (GRAPHD_LIB,
GRAPHD_BIN, GRAPHD_HOST_KERNELS, GRAPHD_ABI_SIZES). Outside CTest a test
whose path is unset is skipped; under CTest (GRAPHD_TEST_STRICT=1) it fails
instead, so a broken setup never passes as a skip."""

import os
import unittest


def path(test, var):
    p = os.environ.get(var)
    strict = os.environ.get("GRAPHD_TEST_STRICT") == "1"
    if not p:
        if strict:
            test.fail(f"${var} is not set")
        raise unittest.SkipTest(f"${var} is not set")
    if not os.path.exists(p):
        test.fail(f"${var}={p} does not exist")
    return p
