from django.urls import path

from apps.knowledge import apis

urlpatterns = [
    path("collections", apis.CollectionListCreateApi.as_view(), name="collection-list"),
    path(
        "collections/<int:collection_id>",
        apis.CollectionDetailApi.as_view(),
        name="collection-detail",
    ),
    path(
        "collections/<int:collection_id>/documents",
        apis.CollectionDocumentsApi.as_view(),
        name="collection-documents",
    ),
    path("documents/<int:document_id>", apis.DocumentDetailApi.as_view(), name="document-detail"),
    path("search", apis.SearchApi.as_view(), name="search"),
]
