from django.urls import path

from apps.usage import apis

urlpatterns = [
    path("usage", apis.UsageApi.as_view(), name="usage"),
    path("quota", apis.QuotaApi.as_view(), name="quota"),
    path("keys/<str:prefix>/limits", apis.KeyLimitsApi.as_view(), name="key-limits"),
]
