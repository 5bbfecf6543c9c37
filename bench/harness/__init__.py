"""What two or more bench scripts share: Django on a fresh data folder, the subprocesses a
run starts, the streams and admissions it times, and how it prints percentiles.

A script puts the repository root on ``sys.path`` and imports from here, never from
another script, so each one can change its measurement without moving another's.
"""

from bench.harness.admission import LARGE, Result, run_configuration
from bench.harness.environment import (
    COLLECTION,
    EMBEDDED_UNSET,
    REPO_ROOT,
    TEAM,
    check_postgres,
    check_redis,
    django_env,
    fresh_database,
    redis_cleanup,
    service_env,
    setup_data,
    setup_django,
    start_django,
)
from bench.harness.processes import (
    CONTEXT_WINDOW,
    FAKE_UPSTREAM_CODE,
    Service,
    Services,
    cpu_seconds,
    free_port,
    quiet_gc,
    start_app,
    wait_ready,
)
from bench.harness.stats import load_average, median, p95, percentile
from bench.harness.streams import (
    BatchStats,
    Stream,
    app_body,
    app_client,
    concurrent_streams,
    direct_body,
    measure_throughput,
    new_conversation,
    stream_app,
    stream_direct,
    tier_client,
)
from bench.harness.vectors import (
    CHUNK_TEXT,
    DIMENSION,
    Fixture,
    create_fixture,
    random_unit_vectors,
)

__all__ = [
    "CHUNK_TEXT",
    "COLLECTION",
    "CONTEXT_WINDOW",
    "DIMENSION",
    "EMBEDDED_UNSET",
    "FAKE_UPSTREAM_CODE",
    "LARGE",
    "REPO_ROOT",
    "TEAM",
    "BatchStats",
    "Fixture",
    "Result",
    "Service",
    "Services",
    "Stream",
    "app_body",
    "app_client",
    "check_postgres",
    "check_redis",
    "concurrent_streams",
    "cpu_seconds",
    "create_fixture",
    "direct_body",
    "django_env",
    "free_port",
    "fresh_database",
    "load_average",
    "measure_throughput",
    "median",
    "new_conversation",
    "p95",
    "percentile",
    "quiet_gc",
    "random_unit_vectors",
    "redis_cleanup",
    "run_configuration",
    "service_env",
    "setup_data",
    "setup_django",
    "start_app",
    "start_django",
    "stream_app",
    "stream_direct",
    "tier_client",
    "wait_ready",
]
