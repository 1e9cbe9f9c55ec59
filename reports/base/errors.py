"""Errors a user can act on. Their message is one line; the CLI prints it and exits 2."""


class CliError(Exception):
    """Bad input or an environment that cannot run the request (no GPU, missing file...)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
