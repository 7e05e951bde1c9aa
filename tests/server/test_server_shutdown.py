"""SIGINT / SIGTERM stop the server in order, even with a stream in flight: exit code 0, no child
process left, the run's records written (the cut-off request recorded as aborted); with the detokenizer
process or without it (server.detokenizer=inline: then the hop trace marks the detokenizer's hops in the
HTTP worker)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

from runtime.records_io import read_run  # noqa: E402
from runtime.server.hop_trace import ENV_VAR  # noqa: E402
from tests.server.server_process import REPO, start_server  # noqa: E402

MODEL = "tiny_mla_moe"
# a context long enough that a stream cut by shutdown cannot finish first on a slow or loaded machine
LONG_STREAM_TOKENS = 30000
LONG_CONTEXT = ["model.hf_config.max_position_embeddings=32768"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def process_name(pid: int) -> str:
    """The name a server process gave itself (prctl: twinserve-sched, twinserve-detok, twinserve-http1)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def read_stream_until_closed(url: str, first_chunk: threading.Event) -> None:
    body = {"model": MODEL, "prompt": "never ending", "max_tokens": LONG_STREAM_TOKENS, "ignore_eos": True,
            "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    first_chunk.set()
    except httpx.HTTPError:
        pass


@pytest.mark.parametrize("sig, mode", [(signal.SIGINT, "process"), (signal.SIGTERM, "process"),
                                       (signal.SIGTERM, "inline")], ids=["SIGINT", "SIGTERM", "SIGTERM-inline"])
def test_signal_shutdown_leaves_no_child_and_writes_records(tmp_path, sig, mode):
    hops = tmp_path / "hops"
    server = start_server(tmp_path, ["server.graceful_shutdown_s=0", f"server.detokenizer={mode}"] + LONG_CONTEXT,
                          env={ENV_VAR: str(hops)} if mode == "inline" else None)   # in-flight: aborted at once
    try:
        r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "done before the end",
                                                             "max_tokens": 4, "ignore_eos": True}, timeout=60)
        assert r.status_code == 200
        dumped = httpx.post(f"{server.url}/dump_records", json={"dir": str(tmp_path / "dump")}, timeout=60).json()
        assert dumped["summary"]["num_finished"] == 1
        # the steps so far come with a dump: 1 prefill and 3 decode steps (warm-up steps are not records;
        # under overlap scheduling, one more decode step was launched before the request was seen to end)
        steps = pd.read_parquet(tmp_path / "dump" / "steps.parquet")
        assert dumped["summary"]["num_steps"] == len(steps) == 5
        assert list(steps["num_prefill_tokens"] > 0) == [True, False, False, False, False]
        children = server.child_pids()
        names = [process_name(pid) for pid in children]
        assert "twinserve-sched" in names and ("twinserve-detok" in names) == (mode == "process"), names
        first_chunk = threading.Event()
        reader = threading.Thread(target=read_stream_until_closed, args=(server.url, first_chunk), daemon=True)
        reader.start()
        assert first_chunk.wait(60)
        start = time.monotonic()
        assert server.stop(sig, timeout_s=60) == 0, server.log()
        assert time.monotonic() - start < 30
        reader.join(30)
        assert not reader.is_alive()
        deadline = time.monotonic() + 10                # multiprocessing's resource tracker exits on EOF
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [(pid, cmdline(pid)) for pid in children if alive(pid)] == []
        requests, steps, summary = read_run(server.run_dir)
        assert sorted(requests["finish_reason"]) == ["abort", "length"]
        assert summary["num_finished"] == 1 and summary["mode"] == "serve" and len(steps) > 0
        assert json.loads((tmp_path / "dump" / "summary.json").read_text())["num_requests"] == 1
        if mode == "inline":                           # the detokenizer's hops, marked in the HTTP worker
            from experiments.serving_hops import hop_table, read_marks
            assert sorted(p.name.split("-")[0] for p in hops.glob("*.csv")) == ["http0", "scheduler"]
            first = hop_table(read_marks(hops))["first_token"]
            assert {"sched_send->detok_recv", "detok_recv->detok_send", "detok_send->http_recv"} <= set(first)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            for pid in server.child_pids():
                os.kill(pid, signal.SIGKILL)


def test_stream_interval_batches_a_streams_chunks(tmp_path):
    """server.stream_interval=4: a streamed completion of 10 tokens arrives in 1 + 2 + 1 chunks of text
    (first token, every 4, the rest with the finish) with the same text as unbatched; 0 is refused."""
    body = {"model": MODEL, "prompt": "interval", "max_tokens": 10, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    server = start_server(tmp_path, ["server.stream_interval=4"])
    try:
        chunks = []
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
        text_chunks = [c for c in chunks if c["choices"]]
        assert len(text_chunks) == 4 and chunks[-1]["usage"]["completion_tokens"] == 10
        whole = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False, "stream_options": None},
                           timeout=60).json()
        assert "".join(c["choices"][0]["text"] for c in text_chunks) == whole["choices"][0]["text"]
    finally:
        server.stop(signal.SIGTERM, timeout_s=60)
    refused = subprocess.run([sys.executable, "run.py", "mode=serve", "model=tiny_mla_moe", "hardware=cpu",
                              "server.stream_interval=0"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "server.stream_interval=0: must be >= 1" in refused.stderr + refused.stdout


def test_a_detokenizer_mode_outside_the_options_is_refused_before_any_process_starts():
    refused = subprocess.run([sys.executable, "run.py", "mode=serve", "model=tiny_mla_moe", "hardware=cpu",
                              "server.detokenizer=thread"], cwd=REPO, capture_output=True, text=True, timeout=120)
    out = refused.stderr + refused.stdout
    assert refused.returncode != 0
    assert "server.detokenizer='thread': must be one of process, inline" in out and "twinserve: serving" not in out
