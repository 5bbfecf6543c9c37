"""The HTTP edges: every method needs auth, and malformed input is a 4xx in the error shape.

Issue 9: ``HEAD /v1/models`` answered 200 and ``HEAD /api/v1/collections`` 500 without a
key; a deeply nested JSON body, a non-ASCII digit in ``Last-Event-ID`` and
``/static/../…`` answered 500.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.resolvers import RegexPattern, RoutePattern
from django.utils.regex_helper import normalize
from rest_framework.views import APIView

from apps.accounts.models import Scope, Team
from apps.accounts.services import IssuedKey, api_key_create, membership_add
from apps.core.asgi import StaticFiles
from apps.core.parsers import MAX_JSON_DEPTH, JsonTooDeep, json_loads
from apps.knowledge.services import collection_create
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)

# Pages meant to be seen without credentials: the sign-in pages, liveness and readiness,
# metrics, the schema and its page. Everything else must refuse a caller without any.
PUBLIC = {"home", "login", "logout", "healthz", "readyz", "metrics", "schema", "docs"}
PUBLIC_ADMIN = {"admin:login"}

_CONVERTER_VALUES = {
    "int": "1",
    "str": "x",
    "slug": "x",
    "path": "x",
    "uuid": str(uuid.UUID(int=1)),
}


def _fill_route(route: str) -> str:
    return re.sub(
        r"<(?:(\w+):)?(\w+)>", lambda m: _CONVERTER_VALUES.get(m.group(1) or "str", "1"), route
    )


def _fill_regex(regex: str) -> str:
    """One path the regex matches: each named group's first alternative, else ``1``."""
    template, params = normalize(regex)[0]
    values = {}
    for name in params:
        group = re.search(rf"\(\?P<{name}>([^()]*)\)", regex)
        alternatives = group.group(1).split("|") if group else []
        first = alternatives[0] if alternatives else ""
        values[name] = first if re.fullmatch(r"[\w-]+", first) else "1"
    return template % values


def _fill(pattern: Any) -> str:
    if isinstance(pattern, RoutePattern):
        return _fill_route(str(pattern))
    assert isinstance(pattern, RegexPattern), pattern
    return _fill_regex(pattern.regex.pattern)


def url_patterns(
    resolver: URLResolver | None = None, prefix: str = "/", namespace: str = ""
) -> Iterator[tuple[str, str, URLPattern]]:
    """(concrete path, name, pattern) for every pattern the URLconf has."""
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        path = prefix + _fill(entry.pattern)
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from url_patterns(entry, path, inner)
        else:
            yield path, f"{namespace}{entry.name or path}", entry


ALL_PATTERNS = list(url_patterns())


def is_scoped_api(pattern: URLPattern) -> bool:
    view = getattr(pattern.callback, "cls", None)
    return (
        isinstance(view, type)
        and issubclass(view, APIView)
        and bool(getattr(view, "required_scopes", None))
    )


def test_the_sweep_reaches_every_pattern() -> None:
    """A path that resolved to some other pattern would test nothing."""
    assert len(ALL_PATTERNS) > 40
    for path, name, pattern in ALL_PATTERNS:
        assert resolve(path).func is pattern.callback, (name, path)


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS"])
@pytest.mark.parametrize(
    ("path", "name", "pattern"), ALL_PATTERNS, ids=[p[1] for p in ALL_PATTERNS]
)
async def test_head_and_options_without_credentials(
    method: str, path: str, name: str, pattern: URLPattern
) -> None:
    response = await AsyncClient().generic(method, path)
    assert response.status_code < 500, (method, path, response.status_code)
    if name in PUBLIC or name in PUBLIC_ADMIN:
        return
    assert not 200 <= response.status_code < 300, (method, path, response.status_code)
    if is_scoped_api(pattern):
        assert response.status_code == 401, (method, path)
        assert response["WWW-Authenticate"] == "Bearer"
        if method == "OPTIONS":
            assert response.json()["error"]["code"] == "missing_api_key"


async def call(
    method: str,
    path: str,
    secret: str,
    body: str = "",
    *,
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
) -> Any:
    """One request through Django's ASGI handler, with ``secret`` as the bearer key."""
    return await AsyncClient().generic(
        method,
        path,
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}", **(headers or {})},
        query_params=query,
    )


async def test_head_and_options_with_a_key_answer_like_get(issued_key: IssuedKey) -> None:
    for path in ("/api/v1/collections", "/v1/models", "/api/v1/usage", "/api/v1/quota"):
        head = await call("HEAD", path, issued_key.secret)
        assert head.status_code == 200, (path, head.status_code)
        assert not head.content
        options = await call("OPTIONS", path, issued_key.secret)
        assert options.status_code == 200, (path, options.status_code)


SCOPED_PATHS = [path for path, _, pattern in ALL_PATTERNS if is_scoped_api(pattern)]


async def test_head_and_options_with_credentials_never_fail(
    team: Team, django_user_model: Any
) -> None:
    """With a key, and with a session (whose team lookup reads the database: OPTIONS of
    the async views runs on the event loop), every method answers below 500. The key has
    every scope, as the session of an owner has."""
    issued_key = await sync_to_async(api_key_create)(team=team, scopes=list(Scope.values))
    user = await sync_to_async(django_user_model.objects.create_user)("ann", password="pw")
    await sync_to_async(membership_add)(team=team, user=user)
    session = AsyncClient()
    await session.aforce_login(user)
    assert len(SCOPED_PATHS) > 10
    for path in SCOPED_PATHS:
        for method in ("HEAD", "OPTIONS"):
            with_key = await call(method, path, issued_key.secret)
            assert with_key.status_code < 500, (method, path, with_key.status_code)
            with_session = await session.generic(method, path)
            assert with_session.status_code < 500, (method, path, with_session.status_code)
            assert with_session.status_code == with_key.status_code, (method, path)


async def test_options_needs_a_scope_of_the_view(team: Team) -> None:
    """On a view without GET, OPTIONS needs one of the view's scopes."""
    read_only = await sync_to_async(api_key_create)(team=team, name="read", scopes=["read"])
    refused = await call("OPTIONS", "/v1/chat/completions", read_only.secret)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "scope_missing"
    assert (await call("OPTIONS", "/api/v1/search", read_only.secret)).status_code == 200
    assert (await call("HEAD", "/api/v1/collections", read_only.secret)).status_code == 200


async def test_a_method_the_view_does_not_name_needs_a_caller_then_is_405(
    issued_key: IssuedKey,
) -> None:
    anonymous = await AsyncClient().put("/api/v1/collections")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "missing_api_key"
    with_key = await call("PUT", "/api/v1/collections", issued_key.secret)
    assert with_key.status_code == 405
    assert with_key.json()["error"]["code"] == "method_not_allowed"


# Malformed input: deep JSON.


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_depth_limit_is_exact() -> None:
    assert isinstance(json_loads(nested(MAX_JSON_DEPTH)), list)
    with pytest.raises(JsonTooDeep):
        json_loads(nested(MAX_JSON_DEPTH + 1))
    deep_object = '{"a": ' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(JsonTooDeep):
        json_loads(deep_object.encode())
    # Brackets inside strings are not nesting.
    assert json_loads(f'{{"text": "{"[" * 1000}"}}') == {"text": "[" * 1000}
    with pytest.raises(JsonTooDeep):
        json_loads("[" * 100_000)


@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000,
        nested(100_000),
        '{"name": ' + nested(MAX_JSON_DEPTH + 5) + "}",
        '{"a":' * 50_000,
    ],
    ids=["unclosed", "closed", "past-the-limit", "objects"],
)
@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/collections",
        "/api/v1/search",
        "/api/v1/tokenize",
        "/api/v1/conversations",
        "/v1/chat/completions",
    ],
)
async def test_deep_json_is_400_invalid_json(issued_key: IssuedKey, path: str, body: str) -> None:
    response = await call("POST", path, issued_key.secret, body)
    assert response.status_code == 400, (path, response.status_code)
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_json"


async def test_deep_json_document_body_is_400(issued_key: IssuedKey, team: Team) -> None:
    collection = await sync_to_async(collection_create)(team=team, name="deep")
    response = await call(
        "POST", f"/api/v1/collections/{collection.pk}/documents", issued_key.secret, nested(100_000)
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


# Malformed input: Last-Event-ID.


@pytest.mark.parametrize(
    "value",
    ["²", "¹2", "12a", "-1", "1" * 19, "0x10", "١٢".encode().decode("latin-1")],
    ids=["superscript", "superscript-one", "trailing", "sign", "long", "hex", "utf8-bytes"],
)
async def test_last_event_id_header_must_be_ascii_digits(issued_key: IssuedKey, value: str) -> None:
    """Header values reach Django as Latin-1, whose superscripts pass ``str.isdigit`` and
    fail ``int``: that was the 500."""
    response = await call(
        "GET", "/api/v1/messages/1/events", issued_key.secret, headers={"Last-Event-ID": value}
    )
    assert response.status_code == 400, (value, response.status_code)
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "code": "invalid_value",
        "message": "Last-Event-ID must be an event id: ASCII digits, at most 18.",
        "param": "Last-Event-ID",
    }


@pytest.mark.parametrize(
    "value",
    ["١٢", "²", "\U0001d7d9", "12a", " 1", "1" * 19, "9" * 5000],
    ids=["arabic-indic", "superscript", "math-digit", "trailing", "space", "long", "huge"],
)
async def test_last_event_id_query_must_be_ascii_digits(issued_key: IssuedKey, value: str) -> None:
    response = await call(
        "GET", "/api/v1/messages/1/events", issued_key.secret, query={"last_event_id": value}
    )
    assert response.status_code == 400, (value, response.status_code)
    assert response.json()["error"]["param"] == "last_event_id"


async def test_a_valid_last_event_id_reaches_the_message(issued_key: IssuedKey) -> None:
    response = await call(
        "GET",
        "/api/v1/messages/999999/events",
        issued_key.secret,
        headers={"Last-Event-ID": "123456789012345678"},
    )
    assert response.status_code == 404  # parsed, then no such message


# Static paths that cannot escape.


async def asgi_get(app: Any, raw_path: str) -> tuple[int, bytes]:
    """What an ASGI server hands the app for ``raw_path``: the path percent-decoded."""
    sent = await asgi_response(app, raw_path)
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, body


async def asgi_response(app: Any, raw_path: str, *, https: bool = False) -> list[dict[str, Any]]:
    """The messages ``app`` sends for a GET of ``raw_path``."""
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": "https" if https else "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("latin-1"),
        "query_string": b"",
        "headers": [],
    }
    sent: list[dict[str, Any]] = []
    requested, finished = False, asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await finished.wait()  # a server reports the disconnect once the response is sent
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            finished.set()

    await app(scope, receive, send)
    return sent


async def not_django(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a static path reached Django")


ESCAPES = [
    "/static/../manage.py",
    "/static/../../../../../../etc/passwd",
    "/static/%2e%2e/manage.py",
    "/static/%2E%2E%2Fmanage.py",
    "/static/admin/%2e%2e/%2e%2e/%2e%2e/manage.py",
    "/static/admin/css/../../../config/settings/base.py",
    "/static//etc/passwd",
    "/static/%2fetc%2fpasswd",
    "/static/./admin/css/base.css",
    "/static/admin//css/base.css",
    "/static/admin/css/base.css%00.txt",
    "/static/%00",
    "/static/admin%5c..%5c..%5cmanage.py",
    "/static/admin/css",
    "/static/admin/css/",
    "/static/",
    "/static/no-such-file.css",
]


@pytest.mark.parametrize("raw_path", ESCAPES)
async def test_static_paths_that_would_escape_are_404(raw_path: str) -> None:
    status, body = await asgi_get(StaticFiles(not_django), raw_path)
    assert status == 404, raw_path
    assert b'"code": "not_found"' in body or b'"code":"not_found"' in body


async def test_static_files_are_still_served() -> None:
    status, body = await asgi_get(StaticFiles(not_django), "/static/admin/css/base.css")
    assert status == 200
    assert body


SECURITY_HEADERS = [
    "Content-Security-Policy",
    "X-Content-Type-Options",
    "Referrer-Policy",
    "X-Frame-Options",
    "Cross-Origin-Opener-Policy",
    "Strict-Transport-Security",
]


@pytest.mark.parametrize("https", [False, True])
async def test_static_responses_carry_the_security_headers_of_pages(
    https: bool, settings: Any
) -> None:
    """Issue 27, item 10: static files (served by Starlette, outside Django) had no CSP,
    X-Frame-Options or HSTS. An SVG or HTML file there is a page of its own."""
    settings.SECURE_HSTS_SECONDS = 3600  # as production sets it
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    page = await AsyncClient().get("/login", secure=https)
    expected = {name: page.headers[name] for name in SECURITY_HEADERS if name in page.headers}
    assert ("Strict-Transport-Security" in expected) is https
    assert {"Content-Security-Policy", "X-Frame-Options"} <= set(expected)

    for raw_path, status in (("/static/admin/css/base.css", 200), ("/static/nothing.css", 404)):
        sent = await asgi_response(StaticFiles(not_django), raw_path, https=https)
        assert sent[0]["status"] == status
        headers = {k.decode().title(): v.decode() for k, v in sent[0]["headers"]}
        served = {name: headers[name] for name in SECURITY_HEADERS if name in headers}
        assert served == expected, raw_path


@pytest.mark.parametrize("raw_path", ESCAPES)
async def test_collected_static_root_cannot_be_escaped(
    raw_path: str, settings: Any, tmp_path: Path
) -> None:
    root = tmp_path / "static"
    (root / "admin" / "css").mkdir(parents=True)
    (root / "admin" / "css" / "base.css").write_text("body {}")
    (tmp_path / "manage.py").write_text("secret")
    settings.STATIC_ROOT = root
    status, _ = await asgi_get(StaticFiles(not_django), raw_path)
    assert status == 404, raw_path
    assert (await asgi_get(StaticFiles(not_django), "/static/admin/css/base.css"))[0] == 200


# Line separators: escaped in every SSE data line.

SEPARATED = ["Hello", "\u2028world", "\u2029and\x85", " more."]


def data_lines(body: bytes) -> list[Any]:
    """The JSON of every ``data:`` line, read the way a careless line reader would:
    ``str.splitlines`` ends lines at U+2028, U+2029 and U+0085 as well."""
    text = body.decode()
    for separator in ("\u2028", "\u2029", "\x85"):
        assert separator not in text
    lines = [line for line in text.splitlines() if line.startswith("data:")]
    return [json.loads(line[5:]) for line in lines if line[5:].strip() != "[DONE]"]


def test_frames_escape_line_separators() -> None:
    from apps.chat.sse import frame_data, frame_stored

    native = frame_stored(3, "delta", {"text": "a\u2028b\u2029c\x85d"})
    assert data_lines(native) == [{"text": "a\u2028b\u2029c\x85d"}]
    assert native.count(b"\r\n") == 4  # id, event, data, blank: still one data line
    openai = frame_data({"choices": [{"delta": {"content": "\u2028"}}]})
    assert data_lines(openai) == [{"choices": [{"delta": {"content": "\u2028"}}]}]
    assert frame_data("[DONE]") == b"data: [DONE]\r\n\r\n"


async def test_native_stream_escapes_line_separators(
    upstream: FakeUpstream, issued_key: IssuedKey
) -> None:
    upstream.script.tokens = SEPARATED
    created = await call("POST", "/api/v1/conversations", issued_key.secret, "{}")
    assert created.status_code == 201
    response = await call(
        "POST",
        f"/api/v1/conversations/{created.json()['id']}/messages",
        issued_key.secret,
        json.dumps({"content": "Hi", "top_k": 0}),
        headers={"Accept": "text/event-stream"},
    )
    assert response.status_code == 200
    body = b"".join([chunk async for chunk in response.streaming_content])
    events = data_lines(body)
    assert "".join(e["text"] for e in events if set(e) == {"text"}) == "".join(SEPARATED)
    assert events[-1]["finish_reason"] == "stop"


async def test_openai_stream_escapes_line_separators(
    upstream: FakeUpstream, issued_key: IssuedKey
) -> None:
    upstream.script.tokens = SEPARATED
    response = await call(
        "POST",
        "/v1/chat/completions",
        issued_key.secret,
        json.dumps(
            {"model": "small", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        ),
    )
    assert response.status_code == 200
    body = b"".join([chunk async for chunk in response.streaming_content])
    chunks = data_lines(body)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "".join(SEPARATED)
    assert body.rstrip().endswith(b"data: [DONE]")
