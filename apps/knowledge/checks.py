"""System checks: search settings out of range stop ``manage.py`` commands (migrate,
runserver, check) with the setting at fault, instead of failing the first search."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from apps.knowledge.backends import BACKENDS
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
    return errors + _backend_errors()


def _backend_errors() -> list[CheckMessage]:
    if settings.VECTOR_BACKEND not in BACKENDS:
        return [
            Error(
                f"VECTOR_BACKEND={settings.VECTOR_BACKEND!r}: one of {sorted(BACKENDS)}",
                id="knowledge.E002",
            )
        ]
    if settings.VECTOR_BACKEND != "milvus":
        return []  # pymilvus is imported only where the engine is used
    from retrieval.milvus import INDEX_PARAMS

    errors: list[CheckMessage] = []
    if settings.MILVUS_INDEX not in INDEX_PARAMS:
        errors.append(
            Error(
                f"MILVUS_INDEX={settings.MILVUS_INDEX!r}: one of {sorted(INDEX_PARAMS)}",
                id="knowledge.E002",
            )
        )
    return errors
