"""An event the page no longer has: a button from before a re-render that dropped it (a deleted chat's
sidebar entry), or any event id a client makes up.  Gradio looks the id up unchecked, and the KeyError
would be a 500; it is the caller's mistake, so it is a 404 in the shape of Gradio's own queue errors."""

from fastapi import Request
from fastapi.responses import JSONResponse

QUEUE_JOIN = "/gradio_api/queue/join"
UNKNOWN_EVENT = "this page has no such event (the page changed since it was loaded); reload the page"


async def unknown_event(request: Request, error: KeyError) -> JSONResponse:
    if not request.url.path.endswith(QUEUE_JOIN):
        raise error  # not a lookup of the caller's event: a fault of ours, for the server log
    return JSONResponse({"detail": UNKNOWN_EVENT}, status_code=404)
