"""tc, the training console's command-line client: the API (/api/v1/schema) from a shell."""

__version__ = "1.0.0"
