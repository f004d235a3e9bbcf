"""The one exception type the control plane raises for things a person must fix."""


class ControlPlaneError(Exception):
    """A failure explained in one line: what happened and what to do (and which log to read).

    The CLI prints it without a traceback; the pytest fixture fails the session with it.
    """
