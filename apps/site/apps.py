from django.apps import AppConfig


class SiteConfig(AppConfig):
    """The top of the arrows: site-level pages and URLs, health and metrics, the stack and
    demo commands, key rotation. It may import every app; no app imports it."""

    name = "apps.site"
    label = "site"
