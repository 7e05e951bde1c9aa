"""A lean asyncio HTTP/1.1 client for the serving benchmark: POST a JSON body on a kept-alive
connection and read the response's server-sent-event lines as they arrive (chunked, sized or
closed bodies). A few microseconds per event, so that the client is not what a benchmark measures.
Plain http only; imports nothing outside the standard library.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPError(Exception):
    """The connection failed or the response was not HTTP/1.x."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class StreamResponse:
    """One response: `status`, `headers` (lower-case names), then `lines()` (or `read()`) once."""

    def __init__(self, client: "StreamClient", conn: _Connection, status: int, headers: dict[str, str]) -> None:
        self._client, self._conn = client, conn
        self.status, self.headers = status, headers
        self._done = False

    async def _chunks(self) -> AsyncIterator[bytes]:
        reader = self._conn.reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";", 1)[0], 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):   # trailers
                        pass
                    break
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await reader.read(min(left, 1 << 16))
                if not data:
                    raise HTTPError("connection closed inside the body")
                left -= len(data)
                yield data
        else:                                                  # the body ends with the connection
            while data := await reader.read(1 << 16):
                yield data
            self.headers["connection"] = "close"
        self._done = True

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines (without the line end) as soon as each is complete."""
        pending = b""
        async for data in self._chunks():
            if pending:
                data, pending = pending + data, b""
            *complete, pending = data.split(b"\n")
            for line in complete:
                yield line[:-1] if line.endswith(b"\r") else line
        if pending:
            yield pending

    async def read(self) -> bytes:
        return b"".join([c async for c in self._chunks()])

    def release(self) -> None:
        """Back to the pool when the body was read to its end and the server keeps the connection."""
        keep = self._done and self.headers.get("connection", "").lower() != "close"
        self._client._release(self._conn, keep)


class StreamClient:
    """Connections to one `http://host:port`, reused across requests (at most `max_idle` kept)."""

    def __init__(self, base_url: str, max_idle: int = 4096) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http":
            raise ValueError(f"{base_url}: only http:// URLs are supported")
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.prefix = url.path.rstrip("/")
        self.max_idle = max_idle
        self._idle: list[_Connection] = []

    async def _connect(self) -> tuple[_Connection, bool]:
        """A connection and whether it was kept from an earlier request."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn, True
            conn.close()
        return await self._open(), False

    async def _open(self) -> _Connection:
        """A new connection (HTTPError when the server cannot be reached)."""
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        except OSError as err:
            raise HTTPError(f"cannot connect to {self.host}:{self.port}: {err}") from err
        return _Connection(reader, writer)

    async def preconnect(self, count: int) -> int:
        """Open connections until `count` are idle in the pool (a client's warm pool, so that requests in
        the measured run do not pay the TCP handshake); the number opened. A server closes connections left
        idle past its keep-alive timeout (uvicorn: 5 s); a request finding one closed opens another."""
        opened = 0
        while len(self._idle) < min(count, self.max_idle):
            self._idle.append(await self._open())
            opened += 1
        return opened

    def _release(self, conn: _Connection, keep: bool) -> None:
        if keep and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    async def post(self, path: str, body: bytes) -> StreamResponse:
        """Send the request and read the status line and headers; the caller reads the body and
        calls `release()` (or closes on error: `response.release()` after a partial read drops it)."""
        while True:
            conn, reused = await self._connect()
            try:
                conn.writer.write(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                                  b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (
                                      (self.prefix + path).encode(), self.host.encode(), self.port, len(body), body))
                status_line = await conn.reader.readline()
                if not status_line:
                    raise ConnectionResetError("closed before the response")
                parts = status_line.split(b" ", 2)
                if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                    raise HTTPError(f"not an HTTP/1.x response: {status_line[:80]!r}")
                headers: dict[str, str] = {}
                while (line := await conn.reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                return StreamResponse(self, conn, int(parts[1]), headers)
            except (ConnectionError, asyncio.IncompleteReadError) as err:
                conn.close()
                if not reused:                                 # a kept connection the server closed: retry
                    raise HTTPError(f"{type(err).__name__}: {err}") from err

    async def aclose(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
