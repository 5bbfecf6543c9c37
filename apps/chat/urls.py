from django.urls import path

from apps.chat import apis, estimate_api

urlpatterns = [
    path("conversations", apis.ConversationListCreateApi.as_view(), name="conversation-list"),
    path(
        "conversations/<int:conversation_id>",
        apis.ConversationDetailApi.as_view(),
        name="conversation-detail",
    ),
    path(
        "conversations/<int:conversation_id>/messages",
        apis.ConversationMessageCreateApi.as_view(),
        name="conversation-messages",
    ),
    path("messages/<int:message_id>", apis.MessageDetailApi.as_view(), name="message-detail"),
    path(
        "messages/<int:message_id>/events", apis.MessageEventsApi.as_view(), name="message-events"
    ),
    path(
        "messages/<int:message_id>/cancel", apis.MessageCancelApi.as_view(), name="message-cancel"
    ),
    path("tokenize", apis.TokenizeApi.as_view(), name="tokenize"),
    path("estimate", estimate_api.EstimateApi.as_view(), name="estimate"),
]
