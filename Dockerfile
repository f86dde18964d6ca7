# The Sluice image: ghcr.io/sluice-io/sluice:<tag>, one image for the dispatcher, the migration Job and
# the agent (deploy/). Build from the repository root:
#   docker build -t ghcr.io/sluice-io/sluice:dev .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package needs (pyproject.toml's packages and their data), so a .dockerignore is not required.
COPY pyproject.toml ./
COPY sluice ./sluice
COPY dispatcher ./dispatcher
COPY agent ./agent
COPY devstack ./devstack
COPY migrations ./migrations
RUN pip install . && rm -rf /src

# The uid/gid the manifests run as (runAsUser/runAsGroup/fsGroup 10001).
RUN groupadd --gid 10001 sluice && useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home sluice
USER 10001:10001
WORKDIR /tmp

ENTRYPOINT ["sluice"]
CMD ["--help"]
