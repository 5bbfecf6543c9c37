from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

urlpatterns = [
    path("", include("apps.site.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("apps.knowledge.urls")),
    path("api/v1/", include("apps.chat.urls")),
    path("api/v1/", include("apps.usage.urls")),
    path("api/v1/", include("apps.accounts.urls")),
    path("v1/", include("apps.chat.openai_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its script as a file (?script): no inline script, as the
    # Content-Security-Policy asks. GET only: DRF would answer OPTIONS with metadata
    # through the page's HTML renderer, which has no template for it (a 500).
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", http_method_names=["get", "head"]),
        name="docs",
    ),
]

handler400 = "apps.core.exceptions.bad_request"
handler403 = "apps.core.exceptions.permission_denied"
handler404 = "apps.core.exceptions.not_found"
handler500 = "apps.core.exceptions.server_error"
