from django.urls import path

from apps.accounts import apis

urlpatterns = [
    path("keys", apis.ApiKeyListCreateApi.as_view(), name="key-list"),
    path("keys/<str:prefix>", apis.ApiKeyRevokeApi.as_view(), name="key-revoke"),
]
