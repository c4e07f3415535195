"""The policy that keeps the pages from loading images and media from other hosts, for any markup from a
message or document that slipped through the escaping."""

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def content_security_policy(remote_images: bool) -> str:
    """Images and media from this server only (and the data: and blob: URLs the page makes itself); images
    from any web host too where the admin allows remote images.  Scripts and styles stay unrestricted:
    Gradio's pages need their inline ones."""
    images = "'self' data: blob: http: https:" if remote_images else "'self' data: blob:"
    return f"img-src {images}; media-src 'self' data: blob:"


class ContentSecurityPolicy:
    """Sends `policy` as the Content-Security-Policy header of every HTTP response."""

    def __init__(self, app: ASGIApp, policy: str):
        self.app = app
        self.header = (b"content-security-policy", policy.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_policy)
