from django.urls import path

from apps.core import apis

urlpatterns = [
    path("", apis.home, name="home"),
    path("healthz", apis.healthz, name="healthz"),
    path("readyz", apis.readyz, name="readyz"),
]
