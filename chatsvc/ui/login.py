"""The UI's own login: a page and a form post that set an HttpOnly cookie, logout, and a gate that sends a
browser without a login to the page.  Gradio's event API checks the cookie through Identity.login_id.

The form post answers browsers with a redirect and other clients (gradio_client) with JSON, as Gradio's own
/login did; a post from another site's page is refused (login CSRF)."""

from html import escape
from pathlib import Path
from string import Template
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from chatsvc.errors import InvalidCredentials, TooManyAttempts
from chatsvc.ui.identity import LOGIN_COOKIE, Identity

PAGE = Template((Path(__file__).resolve().parents[2] / "static" / "login.html").read_text())
USERNAME_MAX, PASSWORD_MAX = 64, 200


def login_routes(identity: Identity, message: str) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/login", response_class=HTMLResponse)
    def login_page(next_path: Annotated[str, Query(alias="next", max_length=2000)] = "/") -> HTMLResponse:
        return _page(message, next_path)

    @router.post("/login")
    async def log_in(
        request: Request,
        username: Annotated[str, Form(max_length=USERNAME_MAX)],
        password: Annotated[str, Form(max_length=PASSWORD_MAX)],
        next_path: Annotated[str, Form(alias="next", max_length=2000)] = "/",
    ) -> Response:
        if not _same_origin(request):
            return _refused(request, 403, "a login must come from this server's own page", next_path)
        try:
            token = await identity.logins.log_in(username.strip(), password, _address(request))
        except TooManyAttempts as error:
            headers = {"Retry-After": str(error.retry_after_s)}
            return _refused(request, 429, str(error), next_path, headers)
        except InvalidCredentials as error:
            return _refused(request, 401, str(error), next_path)
        return _logged_in(request, token, next_path, identity.logins.policy.lifetime_hours)

    @router.get("/logout")
    async def log_out(request: Request) -> RedirectResponse:
        """Ends this login when the browser opens it as a page from this site: not a link on another site,
        nor an image in a message that points here."""
        token = request.cookies.get(LOGIN_COOKIE)
        if token and _opened_here(request):
            await identity.logins.log_out(token)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(LOGIN_COOKIE, path="/")
        return response

    return router


class LoginGate:
    """Sends a browser that opens a UI page without a valid login to the login page, which brings it back."""

    def __init__(self, app: ASGIApp, identity: Identity, pages: list[str]):
        self.app = app
        self.identity = identity
        self.pages = set(pages)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "GET"
            and scope["path"] in self.pages
            and await self.identity.login_id(Request(scope)) is None
        ):
            target = f"/login?next={quote(scope['path'])}"
            return await RedirectResponse(target, status_code=303)(scope, receive, send)
        await self.app(scope, receive, send)


def _logged_in(request: Request, token: str, next_path: str, lifetime_hours: float) -> Response:
    response = (
        RedirectResponse(_local(next_path), status_code=303)
        if _is_browser(request)
        else JSONResponse({"success": True})
    )
    response.set_cookie(
        LOGIN_COOKIE,
        token,
        max_age=int(lifetime_hours * 3600),
        path="/",
        httponly=True,  # page scripts never see it
        samesite="lax",  # other sites' posts and fetches go without it
        secure=request.url.scheme == "https",
    )
    return response


def _refused(
    request: Request, status: int, reason: str, next_path: str, headers: dict | None = None
) -> Response:
    if _is_browser(request):
        return _page(reason[:1].upper() + reason[1:] + ".", next_path, status, headers, error=True)
    return JSONResponse({"detail": reason}, status_code=status, headers=headers)


def _page(
    message: str, next_path: str, status: int = 200, headers: dict | None = None, error: bool = False
) -> HTMLResponse:
    html = PAGE.substitute(
        message=escape(message), next=escape(_local(next_path)), message_class="error" if error else "note"
    )
    return HTMLResponse(html, status_code=status, headers=headers)


def _same_origin(request: Request) -> bool:
    """Browsers name the page a post comes from; other clients send no Origin and are not at risk."""
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")


def _opened_here(request: Request) -> bool:
    """Browsers say what a request is for and where it comes from; other clients say neither."""
    headers = request.headers
    return (
        headers.get("sec-fetch-site") != "cross-site"
        and headers.get("sec-fetch-mode", "navigate") == "navigate"
    )


def _is_browser(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def _local(path: str) -> str:
    """Only a path on this server (never //host or a URL), so the login cannot send anyone elsewhere."""
    return path if path.startswith("/") and not path.startswith(("//", "/\\")) else "/"


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"
