"""The load benchmarks' HTTP client against a small HTTP/1.1 server on loopback that answers as told."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.keepalive import HttpError, KeepAlive


async def _serve(answer, connections: list[int]):
    """A server that reads each request (its head and ``content-length`` body) and writes ``answer(n, body)``'s
    bytes, n counting the connection's requests; None closes the connection unanswered. ``connections`` gets one
    entry a connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(0)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = await reader.readexactly(length)
                reply = answer(connections[-1], body)
                connections[-1] += 1
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.CancelledError):  # the client has gone, or the test has ended
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_a_client_sends_every_request_on_one_connection_and_reads_each_answer_whole() -> None:
    async def main():
        connections: list[int] = []
        server, url = await _serve(lambda n, body: _ok(b'{"n": %d, "echo": %s}' % (n, body)), connections)
        client = KeepAlive(url, 5)
        answers = [await client.post("/v1/rerank", b'"%d"' % i) for i in range(5)]
        client.close()
        server.close()
        return answers, connections

    answers, connections = asyncio.run(main())
    assert connections == [5]
    assert [a[0] for a in answers] == [200] * 5
    assert [a[2] for a in answers] == [b'{"n": %d, "echo": "%d"}' % (i, i) for i in range(5)]
    assert answers[0][1]["content-length"] == str(len(answers[0][2]))


def test_a_chunked_answer_and_its_headers_are_read() -> None:
    chunked = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\ntransfer-encoding: chunked\r\n\r\n"
    chunked += b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\ntrailer: t\r\n\r\n"

    async def main():
        server, url = await _serve(lambda n, body: chunked if n == 0 else _ok(b"next"), [])
        client = KeepAlive(url, 5)
        answers = [await client.post("/rerank", b"{}"), await client.post("/rerank", b"{}")]
        client.close()
        server.close()
        return answers

    (status, headers, body), second = asyncio.run(main())
    assert (status, headers["retry-after"], body) == (429, "1", b"hello world")
    assert second[2] == b"next"  # the trailer was read to its end: the next answer starts clean


def test_a_connection_the_server_closes_is_opened_again() -> None:
    async def main():
        connections: list[int] = []

        # the first connection: an answer that says close; the second: closed unanswered after one answer, as a
        # server closes an idle keep-alive connection; the third answers on
        def answer(n, body):
            if len(connections) == 1:
                return _ok(b"a", "connection: close\r\n")
            if len(connections) == 2 and n == 1:
                return None
            return _ok(b"b")

        server, url = await _serve(answer, connections)
        client = KeepAlive(url, 5)
        bodies = [(await client.post("/", b""))[2] for _ in range(3)]
        client.close()
        server.close()
        return bodies, connections

    bodies, connections = asyncio.run(main())
    assert bodies == [b"a", b"b", b"b"]
    assert connections == [1, 2, 1]  # the third request went out again on a new connection


def test_a_failed_exchange_is_an_http_error_and_the_next_request_reconnects() -> None:
    async def main():
        server, url = await _serve(lambda n, body: b"garbage\r\n\r\n" if body == b"bad" else _ok(b"ok"), [])
        client = KeepAlive(url, 5)
        with pytest.raises(HttpError, match="not an HTTP/1 answer"):
            await client.post("/", b"bad")
        answer = await client.post("/", b"good")
        silent, silent_url = await _serve(lambda n, body: b"", [])  # answers nothing
        with pytest.raises(HttpError, match="TimeoutError"):
            await KeepAlive(silent_url, 0.2).post("/", b"")
        server.close()
        silent.close()
        return answer

    assert asyncio.run(main())[2] == b"ok"


def test_no_server_is_an_http_error_and_a_url_that_is_not_http_is_refused() -> None:
    async def main():
        server, url = await _serve(lambda n, body: _ok(b""), [])
        server.close()
        await server.wait_closed()
        await KeepAlive(url, 5).post("/", b"")

    with pytest.raises(HttpError, match=r"ConnectionRefusedError|OSError"):
        asyncio.run(main())
    with pytest.raises(ValueError, match="http://host:port"):
        KeepAlive("https://example.org", 5)
