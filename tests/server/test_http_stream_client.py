"""The benchmark's HTTP client against a scripted asyncio server: chunked bodies whose lines straddle
chunks, sized bodies, bodies ended by closing, kept-alive connections reused until the server closes
one."""
from __future__ import annotations

import asyncio

from experiments.http_stream_client import StreamClient


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def serve(responses: list[bytes], close_after: set[int]):
    """Answers request i (in arrival order, over any connection) with responses[i]; closes the
    connection after the requests numbered in close_after. Returns (server, connections seen, bodies)."""
    state = {"next": 0, "connections": 0, "bodies": []}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state["connections"] += 1
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            state["bodies"].append(await reader.readexactly(length))
            i = state["next"]
            state["next"] += 1
            writer.write(responses[i])
            await writer.drain()
            if i in close_after:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, state


def test_chunked_sized_and_closed_bodies_over_kept_connections():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    responses = [
        head + b"transfer-encoding: chunked\r\n\r\n" + chunked(b"data: 1\n\nda", b"ta: 2\r\n", b"\ndata: [DONE]\n\n"),
        head + b"content-length: 9\r\n\r\ndata: 3\n\n",
        head + b"transfer-encoding: chunked\r\n\r\n" + chunked(b"data: 4\n\n"),   # server closes after this one
        b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\nbad request",          # ends with the connection
    ]

    async def main():
        server, state = await serve(responses, close_after={2, 3})
        port = server.sockets[0].getsockname()[1]
        client = StreamClient(f"http://127.0.0.1:{port}")
        got = []
        for body in (b'{"a": 1}', b"{}", b"{}", b"{}"):
            r = await client.post("/v1/completions", body)
            got.append((r.status, [line async for line in r.lines()]))
            r.release()
            await asyncio.sleep(0.05)                          # lets the server's close arrive
        await client.aclose()
        server.close()
        return got, state

    got, state = asyncio.run(main())
    assert got[0] == (200, [b"data: 1", b"", b"data: 2", b"", b"data: [DONE]", b""])
    assert got[1] == (200, [b"data: 3", b""])
    assert got[2] == (200, [b"data: 4", b""])
    assert got[3] == (400, [b"bad request"])
    assert state["bodies"][0] == b'{"a": 1}'
    assert state["connections"] == 2                           # reused until the server closed it


def test_preconnected_connections_are_used_without_new_handshakes():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    responses = [head + b"content-length: 9\r\n\r\ndata: %d\n\n" % i for i in range(3)]

    async def main():
        server, state = await serve(responses, close_after=set())
        port = server.sockets[0].getsockname()[1]
        client = StreamClient(f"http://127.0.0.1:{port}")
        opened = await client.preconnect(3)
        again = await client.preconnect(3)                     # the pool is full already
        await asyncio.sleep(0.05)
        before = state["connections"]
        posts = [await client.post("/v1/completions", b"{}") for _ in range(3)]   # three at once
        got = [[line async for line in r.lines()] for r in posts]
        for r in posts:
            r.release()
        await client.aclose()
        server.close()
        return opened, again, before, state["connections"], got

    opened, again, before, after, got = asyncio.run(main())
    assert (opened, again) == (3, 0)
    assert before == after == 3                                # three requests in flight, no new connection
    assert sorted(got) == [[b"data: %d" % i, b""] for i in range(3)]
