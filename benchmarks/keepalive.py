"""The load benchmarks' HTTP client: one keep-alive HTTP/1.1 connection per client, on asyncio streams.

A closed-loop client of :func:`benchmarks.load.drive` sends its next request only once its last is answered, so it
needs one connection, never a pool. A general client's pool looks at every connection it holds on each request
(httpx asks the socket of each whether it is readable), work that grows with the number of clients and that the
load benchmark would count as the server's latency; this one does nothing per request but write it and read its
answer.

It speaks the HTTP/1.1 that ``distill serve`` answers: a POST with a ``Content-Length`` body, an answer with a
``Content-Length`` or a chunked body; an answer that says ``Connection: close`` (or a connection the server has
closed) has the next request open a new connection.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class HttpError(Exception):
    """The exchange failed: no connection, a timeout, or an answer that is not HTTP/1.1."""


class KeepAlive:
    """One HTTP/1.1 connection to ``url``'s host, opened on the first request and again after the server closes it.

    Args:
        url: ``http://host:port``.
        timeout: seconds an exchange (connecting, sending, reading the whole answer) may take.
    """

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"an http://host:port url, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout = timeout
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, route: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict, bytes]:
        """The answer's status, headers (names lower-case) and body.

        Raises:
            HttpError: the exchange failed (the connection is closed; the next request opens another).
        """
        head = (
            f"POST {route} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        reused = self._streams is not None
        try:
            return await asyncio.wait_for(self._exchange(head + body), self.timeout)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            self.close()
            if reused and isinstance(e, asyncio.IncompleteReadError) and not e.partial:
                return await self.post(route, body, content_type)  # the server had closed the idle connection
            raise HttpError(f"{type(e).__name__}: {e}") from e
        except (TimeoutError, OSError, ValueError, asyncio.LimitOverrunError) as e:
            self.close()
            raise HttpError(f"{type(e).__name__}: {e}") from e

    async def _exchange(self, request: bytes) -> tuple[int, dict, bytes]:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._streams
        writer.write(request)
        await writer.drain()
        status_line, *lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        version, _, status = status_line.partition(" ")
        if not version.startswith("HTTP/1.") or not status[:3].isdigit():
            raise ValueError(f"not an HTTP/1 answer: {status_line[:80]!r}")
        headers = {}
        for line in lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _chunked(reader)
        else:
            body = await reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return int(status[:3]), headers, body

    def close(self) -> None:
        """Close the connection (the next request opens another)."""
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, its trailers skipped."""
    chunks = []
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)
    while await reader.readuntil(b"\r\n") != b"\r\n":
        pass
    return b"".join(chunks)
