"""SGLang's operational endpoints besides the APIs: /health_generate (a token through the whole pipeline),
/get_model_info, /flush_cache by GET or POST, and the OpenAI model retrieval (`client.models.retrieve`)."""
from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")

MODEL = "tiny_mla_moe"


def test_health_generate_runs_a_token_and_leaves_nothing_in_flight(server):
    r = httpx.get(f"{server.url}/health_generate", timeout=60)
    assert r.status_code == 200
    info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()
    assert info["scheduler"]["num_in_flight"] == 0 and info["num_http_requests_in_flight"] == 0


def test_model_info_names_the_model(server):
    info = httpx.get(f"{server.url}/get_model_info", timeout=30).json()
    assert info["is_generation"] is True and info["model_path"] == MODEL and info["served_model_name"] == MODEL


def test_flush_cache_by_get_and_post(server):
    assert httpx.get(f"{server.url}/flush_cache", timeout=30).status_code == 200
    assert httpx.post(f"{server.url}/flush_cache", timeout=30).status_code == 200


def test_openai_client_retrieves_the_model_and_not_another(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=30)
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
