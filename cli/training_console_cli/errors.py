"""How tc fails: one line on stderr and an exit code, never a traceback."""

# Bad input (arguments, files, a request the console refused as wrong): exit 2, like a usage error.
EXIT_BAD_INPUT = 2
# Anything else that stopped the command (the console unreachable, a server error): exit 1.
EXIT_FAILED = 1


class CliError(Exception):
    """What went wrong, in one line, and the exit code that says so."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


class BadInput(CliError):
    def __init__(self, message: str):
        super().__init__(message, EXIT_BAD_INPUT)
