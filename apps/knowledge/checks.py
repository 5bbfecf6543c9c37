"""System checks: search settings out of range stop ``manage.py`` commands (migrate,
runserver, check) with the setting at fault, instead of failing the first search."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, register

from apps.knowledge.services.search import bm25_parameters, fusion_policy


@register("retrieval")
def search_settings_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name, read in (
        ("SEARCH_FUSION, SEARCH_FUSION_ALPHA, SEARCH_FUSION_DEPTH", fusion_policy),
        ("KEYWORD_BM25_K1, KEYWORD_BM25_B", bm25_parameters),
    ):
        try:
            read()
        except ValueError as exc:
            errors.append(
                Error(
                    f"{name}: {exc}", hint="See config/settings/retrieval.py.", id="knowledge.E001"
                )
            )
    return errors
