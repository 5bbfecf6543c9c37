from django.contrib.auth import views as auth_views
from django.urls import path

from apps.chat.views import chat_page
from apps.core import apis

urlpatterns = [
    path("", chat_page, name="chat"),
    path("about", apis.home, name="home"),
    path("login", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", apis.healthz, name="healthz"),
    path("readyz", apis.readyz, name="readyz"),
    path("metrics", apis.metrics, name="metrics"),
]
