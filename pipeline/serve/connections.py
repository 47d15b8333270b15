"""The server's connection limits that uvicorn does not give: a time for the request head."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


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

        def _head_late(self) -> None:
            if self.cycle is self._armed_for and not self.transport.is_closing():
                self.transport.close()  # no new request began since it was armed

    return GuardedH11
