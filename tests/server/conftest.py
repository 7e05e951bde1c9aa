"""Served tiny models shared by the API tests of this package (each started once, on first use): `server`
with the detokenizer process (server.detokenizer=process, the default), `server_inline` without it
(server.detokenizer=inline); `any_server` runs a test against each."""
from __future__ import annotations

import signal

import pytest

from tests.server.server_process import ServerProcess, start_server

DETOKENIZER_MODES = ("process", "inline")


def _serve(tmp_path_factory, name: str, extra: list[str]) -> ServerProcess:
    pytest.importorskip("fastapi")
    pytest.importorskip("torch")
    return start_server(tmp_path_factory.mktemp(name), extra)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    srv = _serve(tmp_path_factory, "server", [])
    yield srv
    srv.stop(signal.SIGTERM)


@pytest.fixture(scope="session")
def server_inline(tmp_path_factory) -> ServerProcess:
    srv = _serve(tmp_path_factory, "server_inline", ["server.detokenizer=inline"])
    yield srv
    srv.stop(signal.SIGTERM)


def server_of(request, mode: str) -> ServerProcess:
    """The shared server of a server.detokenizer mode."""
    return request.getfixturevalue("server" if mode == "process" else "server_inline")


@pytest.fixture(params=DETOKENIZER_MODES)
def any_server(request) -> ServerProcess:
    """The shared server of each server.detokenizer mode in turn."""
    return server_of(request, request.param)
