"""The HTTP layer's view of failures: every error is JSON in OpenAI's shape, never a stack trace."""

import re

from fastapi import FastAPI, Request
from fastapi import HTTPException as FastAPIHTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatsvc.errors import (
    Conflict,
    EngineFailed,
    EngineUnavailable,
    Forbidden,
    NotAvailable,
    NotFound,
    QueueFull,
)

LIMITED_PREFIXES = ("/v1/", "/api/")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented",
    503: "service_unavailable",
}


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def error_body(error: Exception) -> dict:
    """An error in the middle of a stream, where no status code can be sent any more."""
    status = 400 if isinstance(error, ValueError) else 500
    return {"error": {"message": str(error), "type": ERROR_TYPES.get(status, "server_error"), "code": status}}


# The service's refusals, by the status each one is (the first class an error is an instance of wins).
STATUSES = [(NotFound, 404), (Conflict, 409), (Forbidden, 403), (ValueError, 400), (NotAvailable, 501)]


def install_error_handlers(app: FastAPI) -> None:
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), error.headers)

    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        status = 400 if any(problem.get("type") == "json_invalid" for problem in problems) else 422
        return error_response(status, "; ".join(_describe(problem) for problem in problems))

    async def refused(request: Request, error: Exception) -> JSONResponse:
        return error_response(next(code for kind, code in STATUSES if isinstance(error, kind)), str(error))

    async def retry_later(request: Request, error: QueueFull | EngineUnavailable) -> JSONResponse:
        status = 429 if isinstance(error, QueueFull) else 503
        headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s else None
        return error_response(status, str(error), headers)

    async def server_error(request: Request, error: Exception) -> JSONResponse:
        # Starlette re-raises an unexpected error after this response, so the server log gets the traceback.
        detail = f"{error}; " if isinstance(error, EngineFailed) else "internal server error; "
        return error_response(500, detail + "the server log has the details")

    handlers = [(HTTPException, http_error), (RequestValidationError, invalid_request)]
    handlers += [(kind, refused) for kind, _ in STATUSES]
    handlers += [(QueueFull, retry_later), (EngineUnavailable, retry_later)]
    handlers += [(EngineFailed, server_error), (Exception, server_error)]
    for kind, handler in handlers:
        app.add_exception_handler(kind, handler)


def _describe(problem: dict) -> str:
    where = ".".join(str(part) for part in problem.get("loc", ()))
    if problem.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({problem.get('ctx', {}).get('error', 'parse error')})"
    return f"{where}: {problem.get('msg')}"


class BodySizeLimit:
    """Refuses request bodies over `max_bytes` on /v1 and /api with 413, before they are read whole;
    `larger` gives paths (regular expressions, e.g. uploads) limits of their own."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: dict[str, int]):
        self.app = app
        self.max_bytes = max_bytes
        self.larger = [(re.compile(path), limit) for path, limit in larger.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(LIMITED_PREFIXES):
            return await self.app(scope, receive, send)
        limit = next((n for path, n in self.larger if path.fullmatch(scope["path"])), self.max_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await error_response(413, _too_large(limit))(scope, receive, send)
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise FastAPIHTTPException(413, _too_large(limit))
            return message

        await self.app(scope, counting_receive, send)


def _too_large(limit: int) -> str:
    return f"the request body is larger than the limit of {limit} bytes"
