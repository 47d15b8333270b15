"""The server's connection limits that uvicorn does not give: a time for the request head;
and a request HTTP cannot parse (two Content-Length headers, a negative one, Content-Length
with chunked, a head beyond h11's limit) answered in OpenAI's error shape, not as text."""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def protocol_error_body(message: str) -> bytes:
    """The 400 of a request that is not HTTP as h11 reads it, in OpenAI's shape."""
    error = {"message": f"the request is not valid HTTP/1.1 ({message.rstrip('.')})",
             "type": "invalid_request_error", "param": "http", "code": 400}  # fmt: skip
    return json.dumps({"error": error}).encode()


def guarded_h11(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol that closes a connection whose request head has not come
    within header_timeout_s of its opening or of its last response (a half-open client that
    sends a byte at a time would otherwise hold it for ever; keep-alive's timer restarts on
    every byte)."""

    class GuardedH11(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _armed_for: object = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._armed_for = self.cycle
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_late)

        def send_400_response(self, msg: str) -> None:
            body = protocol_error_body(msg)
            headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                       (b"content-length", str(len(body)).encode())]  # fmt: skip
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):  # fmt: skip
                self.transport.write(self.conn.send(event) or b"")
            self.transport.close()

        def _head_late(self) -> None:
            if self.cycle is self._armed_for and not self.transport.is_closing():
                self.transport.close()  # no new request began since it was armed

    return GuardedH11
