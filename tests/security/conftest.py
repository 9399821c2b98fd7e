"""The attack suite: each test tries one attack as an attacker would, against real services where the claim
needs them (the local cluster's nodes, the Celery worker, the web server), and is a row of the attack table
printed at the end of the run (tests/suite_tables.py). The people and the catalogue are the unit tests'."""

from tests.fixtures import api, catalogue, make_job, owner, staff, stranger, teammate, token  # noqa: F401 - fixtures, found by name
from tests.unit.conftest import cache_of_each_test_its_own, language_of_each_test_its_own  # noqa: F401 - autouse fixtures
