"""The FastAPI application's construction: FastAPI's own OpenTelemetry instrumentation is off where this FastAPI
has it (the server keeps its own metrics), and a FastAPI without the keyword is built as before."""
from __future__ import annotations

import inspect

import pytest

fastapi = pytest.importorskip("fastapi")

from runtime.server.http_app import TELEMETRY_OFF, create_app, without_telemetry  # noqa: E402


def test_the_keyword_is_given_only_to_a_fastapi_that_has_it():
    class Old:
        def __init__(self, *, title: str = "") -> None:
            pass

    class New:
        def __init__(self, *, title: str = "", telemetry: dict | None = None) -> None:
            pass

    assert without_telemetry(Old) == {}
    assert without_telemetry(New) == {"telemetry": TELEMETRY_OFF}


def test_the_served_app_turns_fastapis_instrumentation_off():
    app = create_app(manager=None, metrics=None, model_name="m", limits=None, server_args={})
    if "telemetry" not in inspect.signature(fastapi.FastAPI.__init__).parameters:
        pytest.skip("this FastAPI has no instrumentation of its own")
    assert {key: app._telemetry[key] for key in TELEMETRY_OFF} == TELEMETRY_OFF
