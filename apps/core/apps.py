from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        from apps.core import checks  # noqa: F401  (registers the deploy checks)
        from apps.core.audit import admin_login_record

        user_logged_in.connect(admin_login_record, dispatch_uid="audit-admin-login")
