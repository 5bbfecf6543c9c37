"""The browser pages in real headless Chromium (Debian's, driven by Playwright): sign in,
conversations, uploads with progress, safe markdown, sources, usage, API keys, the
Content-Security-Policy, and a phone-sized screen.

Screenshots of each page go to ``$RAGTIER_SCREENSHOT_DIR`` (else a temporary folder); the
paths are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils import timezone

from apps.accounts.models import ApiKey, Membership, Team
from apps.accounts.services import api_key_create
from apps.chat.models import Conversation, Message
from apps.knowledge.models import Document
from apps.usage.models import Limit
from tests import factories
from tests.apps.chat.test_detach import wait_settled
from tests.fake_upstream import FakeUpstream
from tests.fault_proxy import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "a-long-password-1"
# What a hostile document or model might try: none of it may run.
PAYLOADS = (
    '<script>window.__pwned = "script"</script>'
    '<img src="/static/missing.png" onerror="window.__pwned = \'onerror\'">'
    "[click me](javascript:window.__pwned='link')"
)


@pytest.fixture(scope="session")
def screenshots() -> Path:
    import os

    folder = os.environ.get("RAGTIER_SCREENSHOT_DIR") or tempfile.mkdtemp(prefix="ragtier-pages-")
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


def snap(page: Any, screenshots: Path, name: str) -> Path:
    path = screenshots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


@pytest.fixture
def browser(asgi_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls
    # are still synchronous ones. Waits use selectors, not wait_for_function: the pages'
    # Content-Security-Policy forbids the eval a predicate needs.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Any:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors
    return page


def sign_in(
    page: Any,
    base: str,
    team: Team,
    django_user_model: Any,
    *,
    role: str = Membership.Role.MEMBER,
    path: str = "/",
) -> Any:
    user = django_user_model.objects.create_user("reader", password=PASSWORD)
    team.memberships.create(user=user, role=role)
    page.goto(f"{base}{path}")
    page.get_by_label("Username").fill("reader")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()
    return user


def ask(page: Any, question: str) -> None:
    page.get_by_label("Question").fill(question)
    page.get_by_role("button", name="Ask").click()
    page.wait_for_selector(".turn:last-child .usage:not(:empty)")


def test_ask_stream_markdown_sources_and_usage(
    page: Any,
    asgi_server: str,
    upstream: FakeUpstream,
    team: Team,
    django_user_model: Any,
    screenshots: Path,
) -> None:
    collection = factories.collection(team=team, name="facts")
    factories.document(
        collection=collection,
        title="Pantry",
        text="The spare pantry key hangs behind the blue door.",
    )
    upstream.script.tokens = ["**Behind**", " the", " blue", " door", " [1].", "\n\n- `key`"]
    sign_in(page, asgi_server, team, django_user_model)
    assert page.is_checked("input[name=collection]")
    ask(page, "Where is the pantry key?")

    answer = page.locator(".answer")
    assert answer.inner_text().startswith("Behind the blue door [1].")
    assert answer.locator("strong").inner_text() == "Behind"
    assert answer.locator("li code").inner_text() == "key"
    sources = page.get_by_role("list", name="Sources")
    assert sources.get_by_role("button").all_inner_texts() == ["Pantry"]
    snippet = sources.locator("blockquote")
    assert not snippet.is_visible()
    answer.get_by_role("link", name="[1]").click()
    assert page.evaluate("document.activeElement.textContent") == "Pantry"
    sources.get_by_role("button", name="Pantry").click()
    assert "behind the blue door" in snippet.inner_text()
    usage = page.locator(".usage").inner_text()
    assert "prompt" in usage and "completion tokens" in usage and "reasoning" in usage
    assert "tokens/s" in usage and "first token" in usage
    assert page.errors == []
    snap(page, screenshots, "chat")


def test_stop_button_cancels_the_answer(
    page: Any, asgi_server: str, upstream: FakeUpstream, team: Team, django_user_model: Any
) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(400)]
    upstream.script.delay = 0.05
    sign_in(page, asgi_server, team, django_user_model)
    page.get_by_label("Question").fill("Talk for a long time")
    page.get_by_role("button", name="Ask").click()
    page.locator(".answer", has_text=re.compile(r"w1 w2 w3")).wait_for()
    page.get_by_role("button", name="Stop").click()
    page.wait_for_selector("#send:not([disabled])")
    for _ in range(100):
        message = Message.objects.filter(role="assistant").first()
        if message is not None and message.status == "cancelled":
            break
        page.wait_for_timeout(50)
    assert message is not None and message.status == "cancelled"
    assert 1 <= message.completion_tokens < 400


LONG = [f" w{i}" for i in range(60)]


def test_a_dropped_connection_resumes_without_losing_or_repeating_text(
    page: Any,
    asgi_server: str,
    upstream: FakeUpstream,
    team: Team,
    django_user_model: Any,
    request: pytest.FixtureRequest,
) -> None:
    upstream.script.tokens, upstream.script.delay = list(LONG), 0.05
    proxy = FaultProxy(target=asgi_server).start()  # the page's network
    request.addfinalizer(proxy.stop)
    sign_in(page, proxy.base_url, team, django_user_model)
    resumes: list[str] = []
    page.on(
        "request", lambda request: resumes.append(request.url) if "/events" in request.url else None
    )
    page.get_by_label("Question").fill("Talk for a while")
    page.get_by_role("button", name="Ask").click()
    page.locator(".answer", has_text=re.compile(r"w1 w2 w3")).wait_for()
    proxy.mode, proxy.times = "unavailable", 2  # a tunnel: the next two reconnects fail
    proxy.cut()
    page.wait_for_selector(".turn:last-child .usage:not(:empty)", timeout=30_000)
    assert page.locator(".answer").inner_text() == "".join(LONG).strip()
    message = wait_settled(Message.objects.get(role="assistant").pk)
    assert message.status == "complete" and message.content == "".join(LONG)
    assert upstream.disconnected_at == [] and len(upstream.requests) == 1  # asked once
    assert len(resumes) >= 3  # the stream broke, two tries failed, the third picked it up
    assert page.errors == []


def test_a_refresh_mid_answer_shows_the_text_so_far_and_goes_on(
    page: Any, asgi_server: str, upstream: FakeUpstream, team: Team, django_user_model: Any
) -> None:
    upstream.script.tokens, upstream.script.delay = list(LONG), 0.05
    sign_in(page, asgi_server, team, django_user_model)
    page.get_by_label("Question").fill("Talk for a while")
    page.get_by_role("button", name="Ask").click()
    page.locator(".answer", has_text=re.compile(r"w1 w2 w3")).wait_for()
    page.reload()
    page.locator(".answer", has_text=re.compile(r"w1 w2 w3")).wait_for()  # the text so far
    page.wait_for_selector(".turn:last-child .usage:not(:empty)", timeout=30_000)
    assert page.locator(".answer").inner_text() == "".join(LONG).strip()
    assert page.locator(".question").all_inner_texts() == ["Talk for a while"]
    assert wait_settled(Message.objects.get(role="assistant").pk).content == "".join(LONG)
    assert len(upstream.requests) == 1
    assert page.errors == []


def test_no_script_from_a_document_or_the_model_ever_runs(
    page: Any,
    asgi_server: str,
    upstream: FakeUpstream,
    team: Team,
    django_user_model: Any,
    screenshots: Path,
) -> None:
    collection = factories.collection(team=team, name="hostile")
    factories.document(
        collection=collection,
        title='Evil <img src=x onerror="window.__pwned=1">',
        text=f"The pantry key is in the drawer. {PAYLOADS}",
    )
    upstream.script.tokens = ["Look ", "**here** [1] ", PAYLOADS, " <b onclick='x()'>b</b>"]
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    sign_in(page, asgi_server, team, django_user_model)
    ask(page, "Where is the pantry key?")
    page.get_by_role("list", name="Sources").get_by_role("button").first.click()

    answer = page.locator(".answer")
    assert answer.locator("strong").inner_text() == "here"
    assert answer.locator("script, img, iframe, [style]").count() == 0
    handlers = page.evaluate(
        """() => [...document.querySelectorAll('.answer *, .sources *')]
                .flatMap(e => [...e.attributes].map(a => a.name))
                .filter(name => name.startsWith('on'))"""
    )
    assert handlers == []
    link = answer.get_by_role("link", name="click me")
    assert link.count() == 0 or not (link.get_attribute("href") or "").startswith("javascript")
    if link.count():
        link.click()
    assert "<script>" in page.locator(".sources blockquote").inner_text()  # shown as text
    # Even markup that bypassed the sanitizer would not run: the policy blocks inline code.
    blocked = page.evaluate(
        """() => new Promise(resolve => {
             const img = document.createElement('img');
             img.setAttribute('onerror', 'window.__csp = 1');
             img.addEventListener('error', () => setTimeout(() => resolve(window.__csp ?? null)));
             img.src = '/static/missing.png';
             document.body.append(img);
           })"""
    )
    assert blocked is None
    assert page.evaluate("window.__pwned ?? null") is None
    assert dialogs == []
    snap(page, screenshots, "chat-hostile")


def test_security_headers_on_every_page(
    page: Any, asgi_server: str, team: Team, django_user_model: Any
) -> None:
    sign_in(page, asgi_server, team, django_user_model)
    for path in ("/", "/usage", "/keys", "/login", "/static/chat/chat.js"):
        response = page.request.get(f"{asgi_server}{path}")
        assert response.status == 200, path
        headers = response.headers
        assert headers["x-content-type-options"] == "nosniff", path
        if path.startswith("/static/"):
            continue
        assert headers["referrer-policy"] == "same-origin", path
        policy = dict(
            part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";")
        )
        assert policy["script-src"] == "'self'", path
        assert "unsafe" not in policy["default-src"], path
    # The API's docs page too: its script is a file (the split view), and it still renders.
    page.goto(f"{asgi_server}/api/docs/")
    page.locator(".swagger-ui .info .title").wait_for()
    assert (
        "script-src 'self';"
        in page.request.get(f"{asgi_server}/api/docs/").headers["content-security-policy"]
    )
    assert page.errors == []
    html = page.request.get(f"{asgi_server}/").text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)  # no inline script
    assert not re.search(r"\son[a-z]+=", html)  # no inline handler
    assert "//cdn" not in html and "unpkg" not in html


def test_upload_shows_progress_to_indexed_and_a_failure(
    page: Any,
    asgi_server: str,
    team: Team,
    django_user_model: Any,
    settings: Any,
    tmp_path: Path,
    screenshots: Path,
) -> None:
    settings.MAX_UPLOAD_BYTES = 4096
    good = tmp_path / "notes.md"
    good.write_text("# Notes\n\nThe spare key hangs behind the blue door.\n")
    blank = tmp_path / "blank.txt"
    blank.write_text("   \n\n  \n")
    unsupported = tmp_path / "tool.exe"
    unsupported.write_bytes(b"MZ\x90\x00")
    huge = tmp_path / "huge.txt"
    huge.write_text("word " * 1000)
    sign_in(page, asgi_server, team, django_user_model)

    page.once("dialog", lambda dialog: dialog.accept("handbook"))
    page.get_by_role("button", name="New collection").click()
    page.locator("#collection option", has_text="handbook").wait_for(state="attached")
    collection = team.collections.get(name="handbook")
    assert page.get_by_label("Collection").input_value() == str(collection.pk)

    page.get_by_label("Upload documents").set_input_files([good, blank, unsupported, huge])

    bar = page.get_by_role("progressbar", name="Indexing notes.md")
    page.locator('[data-file="notes.md"] .status', has_text=re.compile("^indexed$")).wait_for()
    assert bar.get_attribute("value") == "100"
    assert (
        page.evaluate("document.querySelector('[aria-label=\"Indexing notes.md\"]').value") == 100
    )
    page.locator('[data-file="blank.txt"] .status', has_text=re.compile("^failed: ")).wait_for()
    failed = Document.objects.get(filename="blank.txt")
    assert failed.status == "failed"
    status = page.locator('[data-file="blank.txt"] .status').inner_text()
    assert status == f"failed: {failed.error}"

    # Refused before upload, with the words the API would use for the same files.
    key = api_key_create(team=team).secret
    with httpx.Client(base_url=asgi_server, headers={"Authorization": f"Bearer {key}"}) as api:
        for path in (unsupported, huge):
            response = api.post(
                f"/api/v1/collections/{collection.pk}/documents",
                files={"file": (path.name, path.read_bytes())},
            )
            assert response.status_code in (413, 415)
            shown = page.locator(f'[data-file="{path.name}"] .status').inner_text()
            assert shown == f"failed: {response.json()['error']['message']}"
    assert set(Document.objects.values_list("filename", flat=True)) == {"notes.md", "blank.txt"}
    assert Document.objects.get(filename="notes.md").status == "indexed"
    assert page.errors == []
    snap(page, screenshots, "upload")


def test_conversations_reopen_after_reload_new_and_delete(
    page: Any,
    asgi_server: str,
    upstream: FakeUpstream,
    team: Team,
    django_user_model: Any,
    screenshots: Path,
) -> None:
    collection = factories.collection(team=team, name="facts")
    factories.document(collection=collection, title="Pantry", text="The key is blue.")
    upstream.script.tokens = ["It", " is", " *blue*", " [1]."]
    sign_in(page, asgi_server, team, django_user_model)
    question = "What colour is the key that opens the pantry, and where exactly is it kept today?"
    ask(page, question)

    page.reload()
    nav = page.get_by_role("navigation", name="Conversations")
    link = nav.get_by_role("link")
    link.first.wait_for()
    title = link.first.inner_text()
    assert title.endswith("…") and question.startswith(title[:-1])
    page.get_by_role("button", name="New conversation").click()
    assert page.locator(".turn").count() == 0
    link.first.click()
    page.wait_for_selector(".turn .answer em")
    assert page.locator(".question").inner_text() == question
    assert page.locator(".answer").inner_text() == "It is blue [1]."
    assert page.get_by_role("list", name="Sources").get_by_role("button").all_inner_texts() == [
        "Pantry"
    ]
    assert "completion tokens" in page.locator(".usage").inner_text()
    snap(page, screenshots, "conversation-reopened")

    page.once("dialog", lambda dialog: dialog.dismiss())
    nav.get_by_role("button", name=f"Delete {title}").click()
    assert Conversation.objects.count() == 1
    page.once("dialog", lambda dialog: dialog.accept())
    nav.get_by_role("button", name=f"Delete {title}").click()
    link.first.wait_for(state="detached")
    assert Conversation.objects.count() == 0
    assert page.locator(".turn").count() == 0


def test_usage_page_chart_and_quota(
    page: Any,
    asgi_server: str,
    upstream: FakeUpstream,
    team: Team,
    django_user_model: Any,
    screenshots: Path,
) -> None:
    Limit.objects.create(team=team, daily_tokens=100_000, monthly_tokens=2_000_000)
    Limit.objects.create(team=team, tag="research", daily_usd=Decimal("1.5"))
    sign_in(page, asgi_server, team, django_user_model)
    ask(page, "Say hello")
    page.get_by_role("link", name="Usage").click()

    chart = page.get_by_role("img", name=re.compile("tokens"))
    assert chart.evaluate("node => node.tagName") == "svg"
    assert int(chart.locator(".bar").last.get_attribute("data-total")) > 0
    quota = page.locator("#quota")
    quota.get_by_text("Daily quota resets").wait_for()
    text = quota.inner_text()
    assert re.search(r"[\d,]+ of 100,000 tokens remaining", text)
    assert "of 2,000,000 tokens remaining" in text
    quota.get_by_text("Tag research").wait_for()  # a tag's money budget, in dollars
    assert "$1.500000 of $1.500000 remaining" in quota.inner_text()
    page.locator("#totals").get_by_text("Total").wait_for()
    assert "chat" in page.locator("#totals").inner_text()
    assert page.errors == []
    snap(page, screenshots, "usage")


def test_keys_page_create_use_and_revoke(
    page: Any,
    asgi_server: str,
    team: Team,
    django_user_model: Any,
    screenshots: Path,
) -> None:
    user = sign_in(page, asgi_server, team, django_user_model, role=Membership.Role.MEMBER)
    page.get_by_role("link", name="API keys").click()
    assert page.get_by_label("ingest").is_disabled()  # a member's role may not grant it
    page.get_by_label("Name", exact=True).fill("laptop")
    page.get_by_role("button", name="Create key").click()
    secret_box = page.get_by_label("New API key")
    secret_box.wait_for()
    secret = secret_box.inner_text()
    issued = ApiKey.objects.get()
    assert secret.startswith(f"rt_{issued.prefix}_")
    assert (issued.user, issued.scopes, issued.name) == (user, ["chat", "read"], "laptop")
    assert issued.expires_at is not None  # the page's default: in 30 days
    assert timedelta(days=29) < issued.expires_at - timezone.now() <= timedelta(days=30)
    row = page.locator(f'tr[data-prefix="{issued.prefix}"]')
    assert "chat, read" in row.inner_text() and "active" in row.inner_text()

    with httpx.Client(base_url=asgi_server, headers={"Authorization": f"Bearer {secret}"}) as api:
        assert api.get("/api/v1/collections").status_code == 200
        snap(page, screenshots, "keys")
        page.once("dialog", lambda dialog: dialog.accept())
        row.get_by_role("button", name=f"Revoke {issued.prefix}").click()
        row.get_by_text("revoked").wait_for()
        refused = api.get("/api/v1/collections")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "revoked_api_key"
    page.reload()
    assert secret not in page.content()  # shown once only


def test_an_owner_sets_a_keys_limits_on_the_keys_page(
    page: Any, asgi_server: str, team: Team, django_user_model: Any
) -> None:
    owner = sign_in(page, asgi_server, team, django_user_model, role=Membership.Role.OWNER)
    key = api_key_create(team=team, scopes=["chat"], user=owner).api_key
    page.get_by_role("link", name="API keys").click()
    page.get_by_role("button", name=f"Limits of {key.prefix}").click()
    page.get_by_role("heading", name=f"Limits of key {key.prefix}").wait_for()
    page.get_by_label("Daily tokens").fill("1000")
    page.get_by_label("Max tokens per request").fill("64")
    page.get_by_role("button", name="Save limits").click()
    page.get_by_role("status").get_by_text("Saved.").wait_for()
    limit = Limit.objects.get(api_key=key)
    assert (limit.daily_tokens, limit.max_tokens, limit.monthly_tokens) == (1000, 64, None)
    assert page.errors == []


def test_a_members_keys_page_offers_no_limits(
    page: Any, asgi_server: str, team: Team, django_user_model: Any
) -> None:
    member = sign_in(page, asgi_server, team, django_user_model, role=Membership.Role.MEMBER)
    key = api_key_create(team=team, scopes=["chat"], user=member).api_key
    page.get_by_role("link", name="API keys").click()
    page.get_by_role("button", name=f"Revoke {key.prefix}").wait_for()
    assert page.get_by_role("button", name=f"Limits of {key.prefix}").count() == 0
    assert page.locator("#key-limits").count() == 0


def test_a_390_px_screen(
    browser: Any,
    asgi_server: str,
    upstream: FakeUpstream,
    team: Team,
    django_user_model: Any,
    screenshots: Path,
) -> None:
    page = browser.new_page(viewport={"width": 390, "height": 844})
    sign_in(page, asgi_server, team, django_user_model)
    ask(page, "Hello from a phone")
    nav = page.get_by_role("navigation", name="Conversations")
    assert not nav.is_visible()  # folded away
    toggle = page.get_by_role("button", name="Conversations", exact=True)
    toggle.click()
    assert nav.is_visible() and toggle.get_attribute("aria-expanded") == "true"
    toggle.click()
    question = page.get_by_label("Question")
    box = question.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    assert box["y"] + box["height"] <= 844  # the composer stays on screen
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    snap(page, screenshots, "chat-390px")
    for path, name in (("/usage", "usage-390px"), ("/keys", "keys-390px")):
        page.goto(f"{asgi_server}{path}")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, path
        snap(page, screenshots, name)
