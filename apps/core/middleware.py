"""The middleware stack: body limits for requests that reach Django without the ASGI guard
(WSGI, the test client), and Django's stock middleware run on the event loop under ASGI."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.middleware import clickjacking, common, csrf, security
from django.utils.deprecation import MiddlewareMixin

from apps.core.exceptions import error_body
from apps.core.limits import body_limit


class EdgeMiddleware:
    """A middleware that works sync and async alike, with no thread hop: a sync-only one
    would make Django run the whole chain below it (the async answer views included)
    through thread hops on every request. Subclasses answer early (:meth:`refuse`) or
    touch the response (:meth:`finish`); neither may do I/O."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def refuse(self, request: HttpRequest) -> HttpResponseBase | None:
        return None

    def finish(self, response: HttpResponseBase) -> HttpResponseBase:
        return response

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        if self.is_async:
            return self._acall(request)
        refusal = self.refuse(request)
        return refusal if refusal is not None else self.finish(self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        refusal = self.refuse(request)
        return refusal if refusal is not None else self.finish(await self.get_response(request))


class BodySizeLimitMiddleware(EdgeMiddleware):
    """413 for a declared body past the endpoint's limit, before Django reads it."""

    def refuse(self, request: HttpRequest) -> HttpResponseBase | None:
        return _refusal(request)


class ContentSecurityPolicyMiddleware(EdgeMiddleware):
    """Adds ``CONTENT_SECURITY_POLICY`` to every response that has none of its own. The
    policy's ``script-src 'self'`` is why pages carry no inline script or handler."""

    def finish(self, response: HttpResponseBase) -> HttpResponseBase:
        return _with_policy(response)


def _with_policy(response: HttpResponseBase) -> HttpResponseBase:
    policy: str = settings.CONTENT_SECURITY_POLICY
    if policy:
        response.headers.setdefault("Content-Security-Policy", policy)
    return response


def _refusal(request: HttpRequest) -> JsonResponse | None:
    limit, code = body_limit(request.content_type or "")
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > limit:
        message = f"The request body is larger than the {limit}-byte limit."
        return JsonResponse(
            error_body(type="invalid_request_error", code=code, message=message), status=413
        )
    return None


class LoopMiddleware(MiddlewareMixin):
    """Mixed into one of Django's stock middleware: its hooks run on the event loop under
    ASGI.

    Django's ``MiddlewareMixin`` runs every hook through ``sync_to_async`` when serving
    async: with the stock stack, about a dozen thread hops per request (in a thread made
    for each request), all before the first byte of a streamed answer. The hooks used here
    only read and set headers, cookies and lazy objects, so they run inline; the one case
    that writes (a session or queued messages to save, see :meth:`writes`) still goes to
    the request's thread, as Django sends it. Served sync (WSGI, the test client), the
    middleware is Django's, untouched. Subclasses stay subclasses of Django's classes, so
    the admin's checks still recognise them.
    """

    process_view: Any
    """The Django class's hook, where it has one; served async, :meth:`_process_view`."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        super().__init__(get_response)
        if self.async_mode and hasattr(self, "process_view"):
            self._sync_process_view: Callable[..., HttpResponseBase | None] = self.process_view
            self.process_view = self._process_view  # Django collects it after __init__

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        # Served async, Django hands this middleware an async get_response.
        get_response = cast(Callable[[HttpRequest], Awaitable[HttpResponseBase]], self.get_response)
        process_request = getattr(self, "process_request", None)
        process_response = getattr(self, "process_response", None)
        response: HttpResponseBase | None = process_request(request) if process_request else None
        response = response or await get_response(request)
        if process_response is not None:
            if self.writes(request):
                process = sync_to_async(process_response, thread_sensitive=True)
                response = await process(request, response)
            else:
                response = process_response(request, response)
        return response

    async def _process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponseBase | None:
        return self._sync_process_view(request, view, args, kwargs)

    def writes(self, request: HttpRequest) -> bool:
        """Whether ``process_response`` would do blocking I/O for this request."""
        return False


class SecurityMiddleware(LoopMiddleware, security.SecurityMiddleware):
    pass


class SessionMiddleware(LoopMiddleware, sessions.SessionMiddleware):
    def writes(self, request: HttpRequest) -> bool:
        session = getattr(request, "session", None)
        return session is not None and (session.modified or settings.SESSION_SAVE_EVERY_REQUEST)


class CommonMiddleware(LoopMiddleware, common.CommonMiddleware):
    pass


class CsrfViewMiddleware(LoopMiddleware, csrf.CsrfViewMiddleware):
    pass


class AuthenticationMiddleware(LoopMiddleware, auth.AuthenticationMiddleware):
    pass


class MessageMiddleware(LoopMiddleware, messages.MessageMiddleware):
    def writes(self, request: HttpRequest) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and bool(storage.used or storage.added_new)


class XFrameOptionsMiddleware(LoopMiddleware, clickjacking.XFrameOptionsMiddleware):
    pass
