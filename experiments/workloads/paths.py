"""Resolve trace paths against the repository root, so they work from Hydra's run directory."""
from __future__ import annotations

from pathlib import Path


def repo_root() -> Path:
    """The directory holding pyproject.toml, found by walking up from this file."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    raise RuntimeError(f"no pyproject.toml above {here}")


def resolve_trace_path(path: str | Path) -> Path:
    """Absolute path of a trace file. Relative paths are taken from the repository root
    (not the current directory). Raises FileNotFoundError if it is not a file."""
    candidate = Path(path).expanduser()
    if not candidate.is_absolute():
        candidate = repo_root() / candidate
    candidate = candidate.resolve()
    if not candidate.is_file():
        raise FileNotFoundError(
            f"workload trace not found: {candidate} (given as {str(path)!r}; relative paths are "
            f"resolved against the repo root {repo_root()}). Pass another file with "
            f"workload.path=/abs/path/to/trace"
        )
    return candidate
