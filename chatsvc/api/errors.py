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


def install_error_handlers(app: FastAPI) -> None:
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), error.headers)

    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        status = 400 if any(problem.get("type") == "json_invalid" for problem in problems) else 422
        return error_response(status, "; ".join(_describe(problem) for problem in problems))

    async def not_found(request: Request, error: NotFound) -> JSONResponse:
        return error_response(404, str(error))

    async def conflict(request: Request, error: Conflict) -> JSONResponse:
        return error_response(409, str(error))

    async def forbidden(request: Request, error: Forbidden) -> JSONResponse:
        return error_response(403, str(error))

    async def bad_value(request: Request, error: ValueError) -> JSONResponse:
        return error_response(400, str(error))

    async def queue_full(request: Request, error: QueueFull) -> JSONResponse:
        return error_response(429, str(error), {"Retry-After": str(error.retry_after_s)})

    async def unavailable(request: Request, error: EngineUnavailable) -> JSONResponse:
        headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s else None
        return error_response(503, str(error), headers)

    async def not_available(request: Request, error: NotAvailable) -> JSONResponse:
        return error_response(501, str(error))

    async def engine_failed(request: Request, error: EngineFailed) -> JSONResponse:
        return error_response(500, f"{error}; the server log has the details")

    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        # Starlette re-raises the error after this response, so the server log gets the traceback.
        return error_response(500, "internal server error; the server log has the details")

    for kind, handler in [
        (HTTPException, http_error),
        (RequestValidationError, invalid_request),
        (NotFound, not_found),
        (Conflict, conflict),
        (Forbidden, forbidden),
        (ValueError, bad_value),
        (QueueFull, queue_full),
        (EngineUnavailable, unavailable),
        (NotAvailable, not_available),
        (EngineFailed, engine_failed),
        (Exception, unexpected),
    ]:
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
