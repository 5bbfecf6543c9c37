"""Login throttling (django-axes) for ``/login`` and ``/admin/login/``.

Failures are counted per username (known or not) and client IP together, and per client IP
alone (``REMOTE_ADDR``: uvicorn's ``--proxy-headers`` puts the real client there behind a
trusted proxy). Either count reaching the limit locks that pair, or that IP, out for the
cool-off, with ``429`` in the API's error shape, before the password is hashed. Never the
username alone: then anyone could lock ``admin`` out for everyone with a few bad passwords.
A successful login clears that username's failures only (see ``apps.accounts.throttle``).
"""

from datetime import timedelta

from config.env import env

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username or IP before ModelBackend hashes the password.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("LOGIN_COOLOFF_MINUTES", default=15.0))
# The pair for one client's guesses at one account; the IP alone for one address spraying
# many usernames (it counts every failure from that address).
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_RESET_ON_SUCCESS = env.bool("LOGIN_RESET_ON_SUCCESS", default=True)
AXES_HANDLER = "apps.accounts.throttle.LoginAttemptHandler"
AXES_LOCKOUT_CALLABLE = "apps.accounts.throttle.lockout_response"
AXES_HTTP_RESPONSE_CODE = 429
# Only the failures table: no row per successful login.
AXES_DISABLE_ACCESS_LOG = True
