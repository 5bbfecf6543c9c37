from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    name = "apps.knowledge"
    label = "knowledge"

    def ready(self) -> None:
        # Register the ingestion tasks with Celery for every process, eager mode included:
        # services enqueue them by name. This imports code only; no model or index loads.
        from apps.knowledge import checks, tasks  # noqa: F401 - checks registers them
