"""Starts `python run.py mode=serve` (tiny model, CPU) in a subprocess on a free port for the server
tests, waits for /health, and stops it with a signal."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
KV_CAPACITY_TOKENS = 32768
# The same model and weights as `engine_overrides()`: dummy weights from the same seed.
MODEL_OVERRIDES = ["model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32",
                   f"kv.capacity_tokens={KV_CAPACITY_TOKENS}"]
STARTUP_TIMEOUT_S = 180.0


def engine_overrides() -> list[str]:
    return ["mode=real"] + MODEL_OVERRIDES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    run_dir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def child_pids(self) -> list[int]:
        """Processes whose parent is the server (scheduler, detokenizer, multiprocessing's tracker)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    pids.append(int(entry.name))
        return pids

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(tmp_path: Path, extra: list[str] = (), env: dict[str, str] | None = None) -> ServerProcess:
    """`extra`: Hydra overrides; `env`: environment variables added to the server's."""
    port = free_port()
    run_dir = tmp_path / "run"
    log_path = tmp_path / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}   # tiny ops: threads contend
    cmd = [sys.executable, "run.py", "mode=serve", *MODEL_OVERRIDES, f"server.port={port}", "progress=false",
           f"hydra.run.dir={run_dir}", *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", run_dir, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not healthy within {STARTUP_TIMEOUT_S} s:\n{server.log()}")


def scheduler_info(server: ServerProcess) -> dict:
    """The scheduler's state as GET /get_server_info reports it."""
    return httpx.get(f"{server.url}/get_server_info", timeout=30).json()["scheduler"]


def wait_idle(server: ServerProcess, timeout_s: float = 60.0) -> dict:
    """The scheduler's state once nothing is in flight, running or waiting (AssertionError after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = scheduler_info(server)
        if state["num_in_flight"] == state["num_running"] == state["num_waiting"] == 0:
            return state
        time.sleep(0.2)
    raise AssertionError(f"server still busy after {timeout_s} s: {scheduler_info(server)}")
