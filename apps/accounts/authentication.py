"""Bearer API keys for DRF."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.accounts.models import ApiKey
from apps.accounts.probes import key_probe_wait
from apps.accounts.selectors import api_key_cache, api_key_refusal
from apps.accounts.services import api_key_touch, secret_matches, split_key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer rt_<prefix>_<secret>``.

    Steady traffic costs no query: the key comes from ``api_key_cache()`` (a revocation
    made in another process is seen within ``API_KEY_CACHE_SECONDS``), the secret is checked
    against its SHA-256 on every request, and ``last_used_at`` is written once a minute.
    Expiry is compared with the clock on every request, so it is exact; a deactivated
    user, or one who left the team, is seen like a revocation (within the cache window).
    Failed lookups are counted per client address (``apps.accounts.probes``): past its
    allowance, an address gets 429 ``rate_limited`` for any key this process has not seen.
    """

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        raw = raw.strip()
        parsed = split_key(raw)
        address = request.META.get("REMOTE_ADDR", "")
        api_key = None
        if parsed:
            # A query, unless cached: refused to an address out of failures, unless it
            # refreshes a key this process held (and the secret matched): a prober behind
            # the same address stops no one's steady traffic.
            def before_query(expired: ApiKey | None) -> None:
                if expired is None or not secret_matches(expired, raw):
                    _refuse_if_waiting(key_probe_wait(address=address, failed=False))

            api_key = api_key_cache().get(prefix=parsed[0], before_query=before_query)
        if api_key is None or not secret_matches(api_key, raw):
            _refuse_if_waiting(key_probe_wait(address=address, failed=True))
            raise exceptions.AuthenticationFailed(
                "The API key is not valid.", code="invalid_api_key"
            )
        refusal = api_key_refusal(api_key=api_key, now=timezone.now())
        if refusal is not None:
            code, message = refusal
            raise exceptions.AuthenticationFailed(message, code=code)
        api_key_touch(api_key=api_key)
        return (api_key.user or AnonymousUser(), api_key)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def _refuse_if_waiting(wait: float) -> None:
    if wait > 0:
        raise exceptions.Throttled(
            wait, detail="Too many failed API key attempts from this address."
        )
