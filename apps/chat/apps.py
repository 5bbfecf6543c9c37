from typing import Any

from django.apps import AppConfig


def _cached_answers_drop(sender: object, *, team_id: int, **kwargs: Any) -> None:
    from apps.chat.response_cache import response_cache_purge

    response_cache_purge(team_id=team_id)


class ChatConfig(AppConfig):
    name = "apps.chat"
    label = "chat"

    def ready(self) -> None:
        from apps.chat import checks  # noqa: F401 - registers the system checks
        from apps.knowledge.signals import team_documents_deleted

        # Knowledge sits below chat and may not import it: it says what it deleted.
        team_documents_deleted.connect(_cached_answers_drop, dispatch_uid="chat-cache-drop")
