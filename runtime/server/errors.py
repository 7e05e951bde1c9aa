"""OpenAI-style error objects of the HTTP server: `APIError` raised anywhere in a handler becomes
`{"error": {"message", "type", "param", "code"}}` with its status. Imports neither torch nor zmq.
"""
from __future__ import annotations

from http import HTTPStatus

from pydantic import ValidationError

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error",
               503: "service_unavailable", 500: "internal_error"}


class APIError(Exception):
    """A request the server refuses: `status` (4xx for the client's fault), a readable message and
    the offending parameter (dotted path) when there is one."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param
        self.code = code or HTTPStatus(status).phrase.lower().replace(" ", "_")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def from_validation_error(err: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the parameter (e.g. `messages.0.role`)."""
    first = err.errors(include_url=False)[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "json_invalid":
        return APIError(f"request body is not valid JSON: {first['msg']}", code="invalid_json")
    where = f"{param}: " if param else "request body: "
    return APIError(where + first["msg"], param=param, code="invalid_value")
