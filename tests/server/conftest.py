"""Served tiny models shared by the API tests of this package (each started once, on first use): `server`
with the detokenizer process (server.detokenizer=process, the default, with first outputs straight to the
HTTP worker), `server_all_via_process` with every output through the detokenizer process
(server.first_outputs_direct=false), `server_inline` without it (server.detokenizer=inline); `any_server`
runs a test against each."""
from __future__ import annotations

import signal

import pytest

from tests.server.server_process import ServerProcess, start_server

DETOKENIZER_MODES = ("process", "all_via_process", "inline")
FIXTURES = {"process": "server", "all_via_process": "server_all_via_process", "inline": "server_inline"}
MODE_OVERRIDES = {"process": [], "all_via_process": ["server.first_outputs_direct=false"],
                  "inline": ["server.detokenizer=inline"]}


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
def server_all_via_process(tmp_path_factory) -> ServerProcess:
    srv = _serve(tmp_path_factory, "server_all_via_process", MODE_OVERRIDES["all_via_process"])
    yield srv
    srv.stop(signal.SIGTERM)


@pytest.fixture(scope="session")
def server_inline(tmp_path_factory) -> ServerProcess:
    srv = _serve(tmp_path_factory, "server_inline", MODE_OVERRIDES["inline"])
    yield srv
    srv.stop(signal.SIGTERM)


def server_of(request, mode: str) -> ServerProcess:
    """The shared server of a detokenizer mode (DETOKENIZER_MODES)."""
    return request.getfixturevalue(FIXTURES[mode])


@pytest.fixture(params=DETOKENIZER_MODES)
def any_server(request) -> ServerProcess:
    """The shared server of each detokenizer mode in turn."""
    return server_of(request, request.param)
