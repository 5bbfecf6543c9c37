"""The chat page in real headless Chromium (Debian's, driven by Playwright)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from apps.accounts.models import Team
from apps.chat.models import Message
from tests import factories
from tests.fake_upstream import FakeUpstream

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


@pytest.fixture
def page(asgi_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls
    # are still synchronous ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page()
        yield page
        browser.close()


def sign_in(page: Any, base: str, team: Team, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("reader", password="a-long-password-1")
    team.memberships.create(user=user)
    page.goto(f"{base}/")
    page.fill("#id_username", "reader")
    page.fill("#id_password", "a-long-password-1")
    page.click("button[type=submit]")
    page.wait_for_selector("#question")


def test_ask_stream_cite_and_show_usage(
    page: Any,
    asgi_server: str,
    upstream: FakeUpstream,
    team: Team,
    django_user_model: Any,
    settings: Any,
) -> None:
    collection = factories.collection(team=team, name="facts")
    factories.document(
        collection=collection,
        title="Pantry",
        text="The spare pantry key hangs behind the blue door.",
    )
    upstream.script.tokens = ["Behind", " the", " blue", " door", " [1]."]
    sign_in(page, asgi_server, team, django_user_model)
    assert page.is_checked("input[name=collection]")
    page.fill("#question", "Where is the pantry key?")
    page.click("#send")
    page.wait_for_selector(".usage:not(:empty)")
    assert page.inner_text(".answer") == "Behind the blue door [1]."
    assert "[1] Pantry" in page.inner_text(".citations")
    assert "completion tokens" in page.inner_text(".usage")
    page.screenshot(path=str(settings.INDEX_DIR.parent / "chat.png"))


def test_stop_button_cancels_the_answer(
    page: Any, asgi_server: str, upstream: FakeUpstream, team: Team, django_user_model: Any
) -> None:
    upstream.script.tokens = [f" w{i}" for i in range(400)]
    upstream.script.delay = 0.05
    sign_in(page, asgi_server, team, django_user_model)
    page.fill("#question", "Talk for a long time")
    page.click("#send")
    page.wait_for_function("document.querySelector('.answer').textContent.length > 10")
    page.click("#stop")
    page.wait_for_selector("#send:not([disabled])")
    for _ in range(100):
        message = Message.objects.filter(role="assistant").first()
        if message is not None and message.status == "cancelled":
            break
        page.wait_for_timeout(50)
    assert message is not None and message.status == "cancelled"
    assert 1 <= message.completion_tokens < 400
