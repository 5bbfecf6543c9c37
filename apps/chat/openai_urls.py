from django.urls import path

from apps.chat import embeddings_api, openai_apis

urlpatterns = [
    path("chat/completions", openai_apis.ChatCompletionsApi.as_view(), name="openai-chat"),
    path("embeddings", embeddings_api.EmbeddingsApi.as_view(), name="openai-embeddings"),
    path("models", openai_apis.ModelListApi.as_view(), name="openai-models"),
]
