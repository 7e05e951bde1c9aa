"""Reading trace files with errors that name the file and the 1-based line number."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


def trace_error(path: Path, line_no: int, what: str) -> ValueError:
    return ValueError(f"{path}:{line_no}: {what}")


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; ValueError on bad JSON or a non-object."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise trace_error(path, line_no, f"bad JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise trace_error(path, line_no, f"expected a JSON object, got {type(row).__name__}")
            yield line_no, row


def _field(row: dict[str, Any], name: str, path: Path, line_no: int) -> Any:
    if name not in row:
        raise trace_error(path, line_no, f"missing field {name!r}")
    return row[name]


def int_field(row: dict[str, Any], name: str, path: Path, line_no: int, min_value: int = 0) -> int:
    """row[name] as an int >= min_value (JSON integers only; bools rejected)."""
    value = _field(row, name, path, line_no)
    if isinstance(value, bool) or not isinstance(value, int):
        raise trace_error(path, line_no, f"field {name!r} must be an integer, got {value!r}")
    if value < min_value:
        raise trace_error(path, line_no, f"field {name!r} must be >= {min_value}, got {value}")
    return value


def number_field(row: dict[str, Any], name: str, path: Path, line_no: int) -> float:
    """row[name] as a finite float >= 0."""
    value = _field(row, name, path, line_no)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise trace_error(path, line_no, f"field {name!r} must be a finite number >= 0, got {value!r}")
    return float(value)


def int_list_field(row: dict[str, Any], name: str, path: Path, line_no: int) -> list[int]:
    """row[name] as a list of ints >= 0."""
    value = _field(row, name, path, line_no)
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        raise trace_error(path, line_no, f"field {name!r} must be a list of integers >= 0")
    return value
