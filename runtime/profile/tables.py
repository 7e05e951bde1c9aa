"""The profile's CSV tables (one row per grid point, appended as measured, so an interrupted run
resumes where it stopped) and its meta JSON (command, versions, git revision, date). Torch-free.
"""
from __future__ import annotations

import csv
import datetime
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path


class ProfileTable:
    """`<dir>/<name>.csv`. `key_columns` identify a grid point; `has(key)` says it was measured."""

    def __init__(self, directory: Path, name: str, key_columns: tuple[str, ...], resume: bool = True) -> None:
        self.path = Path(directory) / f"{name}.csv"
        self.key_columns = key_columns
        self._keys: set[tuple[str, ...]] = set()
        if self.path.exists() and not resume:
            self.path.unlink()
        if self.path.exists():
            with self.path.open(newline="") as f:
                for row in csv.DictReader(f):
                    self._keys.add(tuple(str(row[c]) for c in key_columns))

    def key(self, values: dict) -> tuple[str, ...]:
        """The point's key as the file holds it (floats written to 9 significant digits)."""
        return tuple(f"{values[c]:.9g}" if isinstance(values[c], float) else str(values[c]) for c in self.key_columns)

    def has(self, values: dict) -> bool:
        return self.key(values) in self._keys

    def append(self, row: dict) -> None:
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow({k: f"{v:.9g}" if isinstance(v, float) else v for k, v in row.items()})
        self._keys.add(self.key(row))

    def __len__(self) -> int:
        return len(self._keys)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_revision() -> str | None:
    """HEAD of the checkout (+ "-dirty" with uncommitted changes); TWINSERVE_GIT_REVISION where the
    tree was copied without its .git (the device machine)."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("TWINSERVE_GIT_REVISION")


def write_meta(directory: Path, run: dict, command: str | None = None) -> dict:
    """Append this run (its command -- this process's unless given --, grid, device, versions, revision,
    date and `run`'s own fields) to `<dir>/meta.json`; it keeps every run that wrote rows into the tables."""
    path = Path(directory) / "meta.json"
    meta = json.loads(path.read_text()) if path.exists() else {"runs": []}
    entry = {
        "command": command or "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
        "versions": {p: _version(p) for p in ("torch", "triton", "flashinfer-python", "numpy")},
        "python": sys.version.split()[0],
        **run,
    }
    meta["runs"].append(entry)
    meta.update({k: run[k] for k in ("hardware", "model", "layout", "device_name") if k in run})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta
