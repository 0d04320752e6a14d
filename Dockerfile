# syntax=docker/dockerfile:1
# The Python compression coordinator as a drop-in for the image that runs CLP's Rust
# `compression-coordinator`: CLP's unchanged command (`/opt/clp/bin/compression-coordinator --config
# /etc/clp-config.yaml`, CLP_DB_USER/CLP_DB_PASS, RUST_LOG) starts the service. Build:
#
#   docker build -t clp-compression-coordinator .
#
# The entrypoint (deploy/docker/entrypoint.sh) also runs the schema step (`db-upgrade`) and the
# health check (`health`); deploy/README.md shows CLP's Compose and Helm deployments using it.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build: the coordinator's wheel (its migrations inside) and a wheel of every dependency.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY coordinator ./coordinator
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Runtime: the wheels installed offline into a virtual environment that has no pip, setuptools or
# compiler; the wheels themselves stay in the build stage. clp-s, shipped in yscope-clp-core's
# wheel, needs only libstdc++ and zlib, which the slim image has.
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/coordinator/venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv --without-pip /opt/coordinator/venv \
    && pip --python /opt/coordinator/venv/bin/python install --no-cache-dir --no-index \
        --find-links /wheels /wheels/clp_compression_coordinator-*.whl \
    && coordinator --version

# The user CLP's deployments run their services as by default (1000:1000). The working directory
# holds the data directory (./var) when the configuration names none; a deployment that runs the
# image as another user mounts a writable volume there.
RUN groupadd --gid 1000 clp \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /var/lib/clp-coordinator \
        --shell /usr/sbin/nologin clp \
    && install -d -o 1000 -g 1000 -m 0755 /var/lib/clp-coordinator \
    && install -d /opt/clp/bin
COPY --chmod=0755 deploy/docker/entrypoint.sh /usr/local/bin/coordinator-entrypoint
# CLP's Compose file and Helm chart start the Rust binary by this path.
RUN ln -s /usr/local/bin/coordinator-entrypoint /opt/clp/bin/compression-coordinator

USER 1000:1000
WORKDIR /var/lib/clp-coordinator
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/coordinator-entrypoint", "health"]
ENTRYPOINT ["/usr/local/bin/coordinator-entrypoint"]
CMD ["run", "--config", "/etc/clp-config.yaml"]
