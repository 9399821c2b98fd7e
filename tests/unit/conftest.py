"""The unit tests' shared fixtures: the people (owner, teammate, stranger, staff), the make_job factory, the
owner's API client and token, and the catalogue a submission names."""

from tests.fixtures import api, catalogue, make_job, owner, staff, stranger, teammate, token  # noqa: F401 - fixtures, found by name
