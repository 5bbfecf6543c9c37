"""The browser's chat page: conversations, uploads and answers, all through the REST API
(static/ragtier/chat.js, upload.js); this view only renders what the page offers."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from rest_framework import serializers

from apps.accounts.selectors import caller_for
from apps.chat.apis import ConversationMessageCreateApi
from apps.chat.services.models import model_aliases
from apps.knowledge.selectors import collection_list
from retrieval import MEDIA_TYPES


@login_required
@ensure_csrf_cookie
def chat_page(request: HttpRequest) -> HttpResponse:
    caller = caller_for(user=request.user, api_key=None)
    collections = list(collection_list(team=caller.team)) if caller else []
    context = {
        "page": "chat",
        "caller": caller,
        "collections": collections,
        "models": model_aliases(),
        "default_model": settings.DEFAULT_MODEL_ALIAS,
        "search_modes": search_modes(),
        "extensions": sorted(MEDIA_TYPES),
        "max_upload_bytes": settings.MAX_UPLOAD_BYTES,
    }
    return render(request, "chat.html", context)


def search_modes() -> list[str]:
    """The retrieval modes a question may name, when the messages endpoint takes one."""
    field = ConversationMessageCreateApi.InputSerializer().fields.get("mode")
    return (
        [str(mode) for mode in field.choices] if isinstance(field, serializers.ChoiceField) else []
    )
