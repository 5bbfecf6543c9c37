"""The browser's chat page: conversations, uploads and answers, all through the REST API
(static/chat/chat.js, upload.js); this view only renders what the page offers."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from apps.accounts.selectors import caller_for
from apps.chat.services.registry import model_aliases
from apps.knowledge.selectors import collection_list
from apps.knowledge.services import SEARCH_MODES
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
        "search_modes": list(SEARCH_MODES),
        "extensions": sorted(MEDIA_TYPES),
        "max_upload_bytes": settings.MAX_UPLOAD_BYTES,
    }
    return render(request, "chat.html", context)
