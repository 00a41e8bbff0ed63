"""Small ASGI pieces shared by the plain middlewares (api/app.py's request counter, tracing/http.py's span)."""

from __future__ import annotations

from starlette.types import Message, Send


class StatusOf:
    """``send`` that notes the response's status on the way: 500 until a response starts (an app that raised)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)
