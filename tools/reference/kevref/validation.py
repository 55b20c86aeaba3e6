"""Kev 1.0's request schema as pydantic v2 models behind a FastAPI route (kev-contract §2.1, §8.5), so the 422
bodies in the fixtures are what FastAPI itself produces (types, `loc`, union member names, messages).

The route runs the schema, then the token limits of §5.2 (422 `{"detail": {"error_type", "message"}}`), and
answers 200 with `{"ok": true}` otherwise: the model is not needed to decide the status of a request.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, Field

from . import contract as C


class Noul(BaseModel):
    type: Literal["noul"]
    instructions: Any = None
    criteria: dict[str, Any] | None = None


class Choice(BaseModel):
    type: Literal["choice"]
    instructions: Any = None
    criteria: dict[str, Any]


def _check(q: Choice) -> Choice:
    if not 1 <= len(q.criteria) <= 255:
        raise ValueError("criteria must have 1..255 options")
    return q


class Score(BaseModel):
    type: Literal["score"]
    instructions: Any = None
    criteria: list[Any] = Field(min_length=1, max_length=255)


Question = Union[Noul, Annotated[Choice, AfterValidator(_check)], Score]


class SystemOneRequest(BaseModel):
    model: str = "kev-latest"
    state: Any
    questions: dict[str, Question] = Field(min_length=1)


def make_app(tokenizer_json: Path):
    from fastapi import FastAPI, HTTPException

    tok = C.KevTokenizer(tokenizer_json)
    app = FastAPI()

    @app.post("/v1/systemone")
    async def systemone(req: SystemOneRequest):
        raw = req.model_dump()
        try:
            c = C.compile_request(raw, tok)
        except C.TokenLimitError as e:
            raise HTTPException(status_code=422, detail=e.body()["detail"]) from None
        return {"ok": True, "input_tokens": c.input_tokens}

    return app


def call(app, body: bytes) -> tuple[int, Any]:
    """POST `body` to the app through ASGI directly (no HTTP client needed); returns (status, parsed JSON body)."""
    sent = {"done": False}
    out: dict[str, Any] = {"status": None, "body": b""}

    async def receive():
        if not sent["done"]:
            sent["done"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(msg):
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        elif msg["type"] == "http.response.body":
            out["body"] += msg.get("body", b"")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/systemone",
        "raw_path": b"/v1/systemone",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8009),
    }
    asyncio.run(app(scope, receive, send))
    return out["status"], json.loads(out["body"])
