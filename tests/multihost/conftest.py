"""pytest configuration of the multi-host tests (tests/multihost): one set of two test hosts,
each with its own sshd, shared by the tests of a run; tests that break a host make their own.
"""

import sys

import pytest

sys.dont_write_bytecode = True  # keep the source tree clean when run from CTest

import hosts as testhosts  # noqa: E402  (this directory is on sys.path: it has no __init__.py)


@pytest.fixture(scope="session")
def hosts():
    testhosts.require("ip", "tc", "unshare", "nsenter", "setsid", "sshd", "ssh", "ssh-keygen")
    with testhosts.Hosts(2, ssh=True) as h:
        yield h
