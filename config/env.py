"""The one environment reader. Every setting that varies by deployment is read here."""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

# "production" (docker-compose sets it): no setting falls back to an embedded default's
# value, and monitoring endpoints are closed unless a token or network opens them.
DJANGO_ENV = env.str("DJANGO_ENV", default="development").strip().lower()
IS_PRODUCTION = DJANGO_ENV == "production"

DATA_DIR = Path(env.path("RAGTIER_DATA_DIR", default=str(BASE_DIR / "data")))
# The embedded default keeps its database, indexes and uploads here: make sure it exists.
DATA_DIR.mkdir(parents=True, exist_ok=True)

# Prometheus multiprocess mode (several ASGI and Celery workers): its folder must exist
# before the first metric is written.
if env.str("PROMETHEUS_MULTIPROC_DIR", default=""):
    Path(env.str("PROMETHEUS_MULTIPROC_DIR")).mkdir(parents=True, exist_ok=True)
