"""Errors a command reports to its user in one line, without a traceback: the CLI
(ratrain/cli.py) prints a UserError as `ratrain: error: ...` and exits with status 2."""


class UserError(Exception):
    """An error caused by the command's input; printed without a traceback."""
