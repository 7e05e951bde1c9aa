"""One served tiny model shared by the API tests of this package (started once, on first use)."""
from __future__ import annotations

import signal

import pytest

from tests.server.server_process import ServerProcess, start_server


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    pytest.importorskip("fastapi")
    pytest.importorskip("torch")
    srv = start_server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop(signal.SIGTERM)
