from django.contrib.auth import views as auth_views
from django.urls import path

from apps.accounts.views import keys_page
from apps.chat.views import chat_page
from apps.site import apis
from apps.usage.views import usage_page

urlpatterns = [
    path("", chat_page, name="chat"),
    path("usage", usage_page, name="usage-page"),
    path("keys", keys_page, name="keys-page"),
    path("about", apis.home, name="home"),
    path("login", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", apis.healthz, name="healthz"),
    path("readyz", apis.readyz, name="readyz"),
    path("metrics", apis.metrics, name="metrics"),
]
