"""Caller mistakes and refusals of the chat service; only the HTTP layer turns them into status codes."""


class NotFound(LookupError):
    """No such thing, or not the caller's: the two are reported alike so ids reveal nothing."""


class Conflict(ValueError):
    """The request contradicts the stored state (e.g. a name already taken)."""


class Forbidden(PermissionError):
    pass


class NotAvailable(RuntimeError):
    """A feature the running engine does not have (e.g. session KV on a backend without it)."""


class QueueFull(RuntimeError):
    def __init__(self, limit: int, retry_after_s: int):
        super().__init__(f"the server is generating {limit} replies already; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class EngineUnavailable(RuntimeError):
    def __init__(self, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineFailed(RuntimeError):
    """The engine broke while generating (not the caller's fault); the server log has the cause."""


class InvalidCredentials(Forbidden):
    """A wrong user name or password; which of the two is never said."""


class TooManyAttempts(RuntimeError):
    def __init__(self, retry_after_s: int):
        minutes = max(1, round(retry_after_s / 60))
        super().__init__(f"too many failed logins; try again in {minutes} minute{'s' if minutes > 1 else ''}")
        self.retry_after_s = retry_after_s
