"""The unit tests' shared fixtures: the people (owner, teammate, stranger, staff) and the make_job factory."""

from tests.fixtures import make_job, owner, staff, stranger, teammate  # noqa: F401 - fixtures, found by name
