from django.urls import path

from apps.chat import openai_apis

urlpatterns = [
    path("chat/completions", openai_apis.ChatCompletionsApi.as_view(), name="openai-chat"),
    path("models", openai_apis.ModelListApi.as_view(), name="openai-models"),
]
