"""The server's warm-up (server.warmup, SGLang's server warm-up): one request through each HTTP worker before
it accepts clients, then a cache flush; the warm-up and its steps stay out of the run's records."""
from __future__ import annotations

from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.server.ipc import WARMUP_RID_PREFIX
from runtime.server.scheduler_process import without_warmup


def request(rid: str, arrival_s: float, finish_s: float) -> Request:
    req = Request.from_spec(RequestSpec(rid=rid, input_ids=[1, 2, 3], output_len=4, arrival_s=arrival_s))
    req.finish_s = finish_s
    return req


def steps_at(starts: list[float]) -> StepLog:
    log = StepLog()
    for name in log.columns:
        log.columns[name] = [0] * len(starts)
    log.columns["start_s"] = list(starts)
    log.columns["step_id"] = list(range(len(starts)))
    return log


def test_the_warmup_and_the_steps_before_the_first_client_leave_the_records():
    warm = request(f"{WARMUP_RID_PREFIX}abc", 0.0, 0.5)
    first, second = request("a", 2.0, 3.0), request("b", 2.5, 4.0)
    kept, steps = without_warmup([warm, first, second], steps_at([0.0, 0.2, 0.55, 2.1, 2.6]))
    assert [r.rid for r in kept] == ["a", "b"]
    assert steps.columns["start_s"] == [2.1, 2.6] and steps.columns["step_id"] == [3, 4]
    kept, steps = without_warmup([warm], steps_at([0.0, 0.55]))
    assert kept == [] and steps.columns["start_s"] == []
    log = steps_at([0.0, 1.0])
    kept, steps = without_warmup([first], log)                 # no warm-up (server.warmup=false): all kept
    assert [r.rid for r in kept] == ["a"] and steps is log


def test_the_first_client_finds_the_warmup_prompt_flushed(server):
    """The warm-up ran and flushed the cache: its prompt, sent first by a client, hits nothing, and hits
    the cache the second time."""
    import httpx

    from runtime.server.http_app import WARMUP_PROMPT

    def cached() -> int:
        r = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny_mla_moe", "prompt": WARMUP_PROMPT,
                                                             "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached() == 0 and cached() > 0
