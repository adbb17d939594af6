"""Shared test configuration.

* ``tests/`` is put on ``sys.path`` so test modules can import the oracle
  (``oracle.py``) and the case helpers (``nbcases.py``) under
  ``--import-mode=importlib``.
* Hypothesis runs derandomised with no deadline (profile ``ci``, the default),
  so a run is reproducible and never fails on timing. ``UMLOS_HYPOTHESIS=thorough``
  selects a profile with ten times the examples and a random seed.
* ``object_store``: a real S3-compatible server (moto) behind a counting proxy, for the
  object-store tests (tests/objstore_support.py).
* The ``backend`` fixture runs a test on every backend this machine has
  (``numpy`` always; ``native`` and ``cupy`` when usable), skipping the others
  with the reason the backend registry gives.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

settings.register_profile(
    "ci", deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "thorough", deadline=None, max_examples=1000, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.load_profile(os.environ.get("UMLOS_HYPOTHESIS", "ci"))

ALL_BACKENDS = ("numpy", "native", "cupy")


@pytest.fixture(params=ALL_BACKENDS)
def backend(request) -> str:
    """A backend name that is usable here (the test is skipped for the others)."""
    from umlos_cuda.backends import get_backend
    from umlos_cuda.errors import UmlosError

    try:
        get_backend(request.param)
    except UmlosError as exc:
        pytest.skip(f"backend {request.param!r} unavailable: {exc.message}")
    return request.param


@pytest.fixture(scope="session")
def object_store():
    """moto's S3 server on a free loopback port behind a counting, fault-injecting proxy
    (tests/objstore_support.py), started the first time a test asks for it and stopped at the end of
    the session; the client's credential variables hold dummy values meanwhile. Skipped without
    moto[server] and obstore."""
    from objstore_support import object_store_session

    with object_store_session() as served:
        yield served
