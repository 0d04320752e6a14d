"""The root of every error a user or an operator can cause."""


class CoordinatorError(Exception):
    """Something a user or an operator can cause and fix; the message says what and how.

    Precise subclasses live next to the code that raises them. Errors that are not the user's
    (a bug, the database driver's) are not under this root.
    """
