# jobq's image: one image runs the migrations (`migrate`), the API (`serve`, the default), the
# key commands (`keys create ...`) and jobq_client workers (`worker module:attr`).
#
#   deploy/build-base.sh          # only where no registry is reachable: makes debian:bookworm-slim
#   podman build --format docker -t jobq .     (or: docker build -t jobq .)
#   docker run --rm -e DATABASE_URL=postgresql://... jobq migrate
#   docker run --rm -e DATABASE_URL=... jobq keys create --role admin --name ops   # prints the key
#   docker run -e DATABASE_URL=... -p 8000:8000 --stop-timeout 15 jobq
#
# Base: Debian's bookworm-slim with Debian's Python 3.11 rather than python:3.11-slim. It is the
# same Debian underneath, but debootstrap alone can make it from Debian's archive
# (deploy/build-base.sh), so the image builds on machines that reach no container registry, and
# Debian ships Python's security fixes with the rest of the system. `--format docker` keeps the
# HEALTHCHECK and STOPSIGNAL below (podman's default OCI format drops HEALTHCHECK).
#
# Settings come from the environment only (README, Configuration): DATABASE_URL at least. The
# image binds 0.0.0.0, so `serve` refuses to start while the database holds no API key (it exits
# 2 and says so): make one first with `keys create`. JOBQ_INSECURE is left unset on purpose.
#
# Stopping: SIGTERM releases parked long-polls at once, then open requests get
# JOBQ_SHUTDOWN_GRACE_SECONDS (10) to finish before the pools close. Give the container that plus
# 5 s (as `jobq serve --workers` gives its children): `docker stop -t 15`, `--stop-timeout 15`,
# compose's `stop_grace_period: 15s`. Docker's default of 10 s can SIGKILL a shutdown whose last
# request used the whole grace.

# ---------------------------------------------------------------------------------------------
# builder: builds jobq's wheel and installs it with its dependencies into /opt/jobq (a venv).
FROM debian:bookworm-slim AS builder
# Marks this stage's images: deploy/build-image.sh keeps the newest as its build cache and
# removes older ones.
LABEL io.jobq.stage=builder

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

# Package-index settings for this build only (deploy/build-image.sh passes the host's): a CA
# bundle mounted with `-v` for a TLS-inspecting network, another index, a mounted pip cache.
# They are build arguments, never ENV, so nothing of them is in the final stage.
ARG PIP_CERT
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CACHE_DIR
ARG PIP_DEFAULT_TIMEOUT=60
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

RUN python3 -m venv /opt/jobq
WORKDIR /src
# The dependencies first, from pyproject.toml alone: a change to the code reuses this layer.
COPY pyproject.toml ./
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" >/tmp/requirements.txt \
    && /opt/jobq/bin/pip install --compile -r /tmp/requirements.txt
COPY README.md alembic.ini ./
COPY alembic ./alembic
COPY app ./app
COPY jobq_client ./jobq_client
# The wheel carries the migrations (app/_migrations, see pyproject.toml): `jobq migrate` runs
# them from the installed package.
RUN /opt/jobq/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/jobq/bin/pip install --compile --no-deps /wheels/jobq-*.whl \
    && /opt/jobq/bin/pip check \
    && /opt/jobq/bin/pip uninstall --yes pip setuptools

# ---------------------------------------------------------------------------------------------
# runtime: Debian's python3 (the venv's interpreter), CA certificates (TLS to PostgreSQL) and
# the user; a stage of its own so that deploy/build-image.sh keeps it as a cache.
FROM debian:bookworm-slim AS runtime
LABEL io.jobq.stage=runtime

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --home-dir /var/lib/jobq --create-home \
        --shell /usr/sbin/nologin jobq

# ---------------------------------------------------------------------------------------------
# final: the runtime and the venv (the migrations inside it); no compiler, no pip, no source tree.
FROM runtime
LABEL io.jobq.stage=image

COPY --from=builder /opt/jobq /opt/jobq

ENV PATH=/opt/jobq/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    JOBQ_HOST=0.0.0.0 \
    JOBQ_PORT=8000 \
    JOBQ_DATA_DIR=/var/lib/jobq

USER jobq:jobq
WORKDIR /var/lib/jobq
EXPOSE 8000
STOPSIGNAL SIGTERM
# /readyz: 200 once the database answers and the loops run (503 otherwise); urlopen raises on
# anything else, so the exit status is the verdict. Python, so the image needs no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('JOBQ_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["jobq"]
CMD ["serve"]
