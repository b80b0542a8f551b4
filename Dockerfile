# inferwatch sidecar image: `docker build -t inferwatch:0.1.0 .`
# Runs as an unprivileged user with nothing to write, so a read-only root filesystem works.
FROM python:3.12.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip install . && rm -rf /src

# A numeric user, so Kubernetes' runAsNonRoot can verify it.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin inferwatch
USER 10001:10001
WORKDIR /

EXPOSE 10177
ENTRYPOINT ["inferwatch", "serve"]
