"""schemathesis drives every documented operation of a live tiny server from its own ``/openapi.json``.

Bodies inside the schema (positive) and outside it (negative) must never get a 5xx, every status code
must be one the document lists, and every response must match its documented content type, headers and
body schema. Bounded: a few dozen examples per operation on a server whose answers are at most 4 tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from paged_core.serve import ServeConfig
from paged_core.serve.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

from .serve_helpers import API_KEY, MODEL_NAME, ServerThread, serve

VOCAB = 49152  # the tiny model's (SmolLM2's) vocabulary
AUTH = {"Authorization": f"Bearer {API_KEY}"}
OPERATIONS = {
    "POST /v1/completions": 40,
    "POST /v1/chat/completions": 40,
    "POST /tokenize": 30,
    "POST /detokenize": 30,
    "GET /v1/models": 5,
    "GET /health": 5,
    "GET /metrics": 5,
}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
TOTALS: dict[str, Any] = {"cases": 0, "seconds": 0.0, "statuses": {}, "slowest": (0.0, "", "")}


@pytest.fixture(scope="module")
def server(loaded: Any) -> Iterator[ServerThread]:
    config = ServeConfig(
        served_model_name=MODEL_NAME,
        api_key=API_KEY,
        max_tokens_limit=4,
        max_n=2,
        max_prompts=4,
        max_body_bytes=1 << 16,
    )
    with serve(loaded, config) as s:
        yield s
    print(
        f"\nschemathesis: {TOTALS['cases']} cases in {TOTALS['seconds']:.1f} s, statuses {TOTALS['statuses']}; "
        "slowest case %.2f s (%s %s)" % TOTALS["slowest"]
    )


@pytest.fixture(scope="module")
def schema(server: ServerThread) -> Any:
    r = httpx.get(f"{server.url}/openapi.json", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    loaded = schemathesis.openapi.from_dict(r.json())
    loaded.config.base_url = server.url
    return loaded


def test_every_route_is_documented_with_bodies_and_errors(schema: Any, server: ServerThread) -> None:
    document = httpx.get(f"{server.url}/openapi.json", headers=AUTH).json()
    labels = {f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item}
    assert labels == set(OPERATIONS)
    for name in ("CompletionRequest", "ChatCompletionRequest", "TokenizeRequest", "DetokenizeRequest", "ErrorBody"):
        assert name in document["components"]["schemas"], name
    completions = document["paths"]["/v1/completions"]["post"]
    assert completions["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CompletionRequest"
    }
    assert set(completions["responses"]) == {"200", "400", "401", "404", "413", "429", "500", "503"}
    assert "Retry-After" in completions["responses"]["429"]["headers"]
    assert set(completions["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert document["paths"]["/health"]["get"]["security"] == []
    assert document["security"] == [{"bearer": []}]


BODIES = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}


def _steer(case: Any, path: str, steer: int, keep: set[int]) -> None:
    """Bend a valid body toward the engine: random bodies nearly always carry some out-of-range optional field
    (the schema has no ranges) and a random model name, so they would all stop at a 400 or 404.

    ``steer`` 3 leaves the body as generated; 2 names the served model; 0 and 1 (hypothesis favours small
    values) also keep only the required fields and at most two optional ones; 0 also makes the prompt usable.
    """
    if steer < 3 and "model" in case.body:
        case.body["model"] = MODEL_NAME
    if steer == 0:  # and a prompt the engine can take
        if path == "/v1/completions" and not (isinstance(case.body.get("prompt"), str) and case.body["prompt"]):
            case.body["prompt"] = "Fuzz"
        elif path == "/tokenize":
            case.body.pop("messages", None)
            case.body.setdefault("prompt", "Fuzz")
        elif path == "/detokenize" and isinstance(case.body.get("tokens"), list):
            case.body["tokens"] = [t % VOCAB for t in case.body["tokens"] if isinstance(t, int)]
    if steer < 2:
        fields = BODIES[path].model_fields
        optional = sorted(k for k in case.body if not fields[k].is_required())
        case.body = {k: v for k, v in case.body.items() if k not in optional or optional.index(k) in keep}


# A GET without parameters has no invalid input to send.
CASES = [
    (label, mode)
    for label in OPERATIONS
    for mode in ("positive", "negative")
    if mode == "positive" or label.startswith("POST")
]


@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{label}-{mode}" for label, mode in CASES])
def test_fuzz_operation(schema: Any, server: ServerThread, label: str, mode: str) -> None:
    method, path = label.split(" ")
    operation = schema[path][method]
    positive = mode == "positive"
    strategy = operation.as_strategy(generation_mode=GenerationMode.POSITIVE if positive else GenerationMode.NEGATIVE)
    checks = CHECKS + ([] if positive else [negative_data_rejection])
    started = time.monotonic()
    seen: dict[int, int] = {}

    @settings(max_examples=OPERATIONS[label], deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy, steer=st.integers(0, 3), keep=st.sets(st.integers(0, 40), max_size=2))
    def run(case: Any, steer: int, keep: set[int]) -> None:
        if positive and isinstance(case.body, dict):
            _steer(case, path, steer, keep)
        t = time.monotonic()
        response = case.call_and_validate(base_url=server.url, headers=AUTH, checks=checks, timeout=30)
        if (elapsed := time.monotonic() - t) > TOTALS["slowest"][0]:
            TOTALS["slowest"] = (elapsed, label, repr(case.body)[:300])
        TOTALS["cases"] += 1
        TOTALS["statuses"][response.status_code] = TOTALS["statuses"].get(response.status_code, 0) + 1
        seen[response.status_code] = seen.get(response.status_code, 0) + 1

    try:
        run()
    finally:
        TOTALS["seconds"] += time.monotonic() - started
        print(f"{label} {mode}: {seen} in {time.monotonic() - started:.1f} s")
