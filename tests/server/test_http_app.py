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


def test_generation_posts_skip_fastapis_layers_and_refusals_are_rendered_as_its_handlers_do():
    """`GenerationFastPath`: a POST to a generation endpoint reaches its handler without FastAPI's middleware
    (a middleware added to the FastAPI app does not see it) and a refusal is the same OpenAI-style error,
    counted in the metrics; other methods and paths go to FastAPI (a GET of /v1/completions is its 405)."""
    from starlette.testclient import TestClient

    from runtime.server.http_app import GenerationFastPath
    from runtime.server.server_metrics import ServerMetrics

    metrics = ServerMetrics("m")
    app = create_app(manager=None, metrics=metrics, model_name="m", limits=None, server_args={})
    seen: list[str] = []

    @app.middleware("http")
    async def note(request, call_next):
        seen.append(f"{request.method} {request.url.path}")
        return await call_next(request)

    with TestClient(GenerationFastPath(app)) as client:
        for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
            r = client.post(path, content=b"{not json", headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", (path, r.text)
        assert seen == []
        assert client.get("/v1/completions").status_code == 405
        assert seen == ["GET /v1/completions"]
    assert metrics.registry.get_sample_value("twinserve_request_errors_total", {"status": "400"}) == 3
