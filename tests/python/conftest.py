"""Fixtures of the Python tests: the path to the aps package, a real apsd on a
free port, and real worker processes (multiprocessing, spawn) with deadlines."""

import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "worker" / "python"))
sys.path.insert(0, str(HERE))

import aps.daemon  # noqa: E402
import ranks  # noqa: E402

APSD = ROOT / "build" / "server" / "apsd"


@pytest.fixture
def apsd():
    """The endpoint of a fresh apsd (build/server/apsd) that must exit cleanly."""
    d = aps.daemon.LocalDaemon(binary=str(APSD), log_level="warn").start()
    try:
        yield d.endpoint
    finally:
        assert d.stop() == 0, "apsd did not exit cleanly"


run_ranks = ranks.run_ranks  # the tests import it from here
