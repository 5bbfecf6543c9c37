"""The production settings pass Django's deploy check with the documented variables, and
no entry point falls back to the embedded default's public SECRET_KEY in production.

Each case runs ``manage.py`` in a subprocess: settings are read once per process.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from config.env import BASE_DIR

# Variables a process may inherit from the test run that would change what it loads.
INHERITED = (
    "DJANGO_SETTINGS_MODULE",
    "DJANGO_ENV",
    "DJANGO_SECRET_KEY",
    "DATABASE_URL",
    "REDIS_URL",
    "DJANGO_ALLOWED_HOSTS",
    "RAGTIER_ENCRYPTION_KEYS",
    "METRICS_TOKEN",
    "METRICS_ALLOWED_NETWORKS",
)


def production_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The variables README documents for production (as docker-compose sets them)."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED}
    env.update(
        DJANGO_ENV="production",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        REDIS_URL="redis://127.0.0.1:6379/14",
        DJANGO_ALLOWED_HOSTS="rag.example.com",
        RAGTIER_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
        RAGTIER_DATA_DIR=str(tmp_path / "data"),
        DJANGO_BEHIND_TLS_PROXY="true",
        METRICS_ALLOWED_NETWORKS="10.0.0.0/8",
    )
    env.update(overrides)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_deploy_check_passes_with_the_production_settings(tmp_path: Path) -> None:
    env = production_env(tmp_path, DJANGO_SETTINGS_MODULE="config.settings.production")
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_the_deploy_check_sees_through_the_projects_middleware(tmp_path: Path) -> None:
    """The project's middleware subclasses Django's; the HSTS and SSL-redirect checks still
    run (Django alone would skip them, finding no stock middleware by its path)."""
    env = production_env(
        tmp_path, DJANGO_SECURE_HSTS_SECONDS="0", DJANGO_SECURE_SSL_REDIRECT="false"
    )
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    assert "security.W004" in result.stderr and "security.W008" in result.stderr


def test_production_without_its_secrets_refuses_to_start(tmp_path: Path) -> None:
    """DJANGO_ENV=production with no DJANGO_SETTINGS_MODULE loads the production settings,
    which name what is missing rather than fall back to the public key."""
    env = production_env(tmp_path)
    del env["DJANGO_SECRET_KEY"]
    result = manage(env, "check")
    assert result.returncode != 0
    assert "Production settings need these environment variables: DJANGO_SECRET_KEY" in (
        result.stderr
    )


def test_the_embedded_settings_refuse_the_public_key_in_production(tmp_path: Path) -> None:
    env = production_env(tmp_path, DJANGO_SETTINGS_MODULE="config.settings.base")
    del env["DJANGO_SECRET_KEY"]
    result = manage(env, "check")
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr


@pytest.mark.parametrize(
    ("behind_proxy", "expected"),
    [("false", "None"), ("true", "('HTTP_X_FORWARDED_PROTO', 'https')")],
)
def test_the_proxy_header_is_trusted_only_behind_a_tls_proxy(
    tmp_path: Path, behind_proxy: str, expected: str
) -> None:
    env = production_env(tmp_path, DJANGO_BEHIND_TLS_PROXY=behind_proxy)
    code = "from django.conf import settings; print(settings.SECURE_PROXY_SSL_HEADER)"
    result = manage(env, "shell", "-v", "0", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_monitoring_is_closed_by_default_in_production(tmp_path: Path) -> None:
    env = production_env(tmp_path)
    code = "from django.conf import settings; print(settings.METRICS_OPEN_BY_DEFAULT)"
    result = manage(env, "shell", "-v", "0", "-c", code)
    assert result.stdout.strip() == "False", result.stderr
