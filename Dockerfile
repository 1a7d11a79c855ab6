# syntax=docker/dockerfile:1.7
# modelpool images, one Dockerfile, two targets, both installed from uv.lock (hashes checked):
#   docker build --target operator -t ghcr.io/modelpool/modelpool-operator:<version> .  (operator + gateway, no torch)
#   docker build --target server   -t ghcr.io/modelpool/modelpool-server:<version> .    (model server, torch)
# `make images` (hack/images.sh) builds both without a daemon: buildah, vfs, chroot isolation, from a base
# made by debootstrap (--build-arg BASE_IMAGE=localhost/modelpool-base:bookworm), since no registry is
# reachable there.  Any Debian-like base with python3.11 (and its venv module), groupadd and useradd works.
#
# Layout (both images): the virtualenv /opt/modelpool (its bin first on PATH), user and group 10001, nothing
# written to the root at run time: the pods mount emptyDirs on /tmp and /home/modelpool, the model cache on
# /cache (HF_HOME=/cache/huggingface), pvc:// models under /models.  Without those volumes (a plain
# `docker run`) the directories exist and uid 10001 may write them.
#
# torch (server): by default the version in uv.lock from PyPI, with its hashes; on x86_64 PyPI's torch is the
# CUDA build and pulls the nvidia-* / cuda-* wheels (~3 GB): one image for GPUs that also runs on CPU.
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu gives the CPU-only variant: the same
# torch version from that index (no hash in the lock for it), without the CUDA wheels; every other package
# still from the lock with hashes.

ARG BASE_IMAGE=python:3.11-slim

# ---- base: Python, the unprivileged user, the writable mount points, the environment -------------------
FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/modelpool \
    PATH=/opt/modelpool/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/home/modelpool \
    HF_HOME=/cache/huggingface
RUN groupadd --system --gid 10001 modelpool \
 && useradd --system --uid 10001 --gid modelpool --home-dir /home/modelpool --create-home modelpool \
 && mkdir -p /cache/huggingface /models \
 && chown -R 10001:10001 /cache /home/modelpool \
 && chmod 1777 /cache /cache/huggingface \
 && chmod 1777 /tmp

# ---- build: uv, the project's wheel and the locked requirements of each image --------------------------
FROM base AS build
ARG UV_VERSION=0.13.9
# --cache-dir=<a cache bound into the build> (hack/images.sh binds the host's uv cache), or no cache.
ARG UV_CACHE_OPT=--no-cache
# pip and uv trust the image's CA bundle (a builder behind a TLS-inspecting proxy binds its own bundle over
# it for the build: hack/images.sh does); build arguments, so nothing of it stays in the image.
ARG SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ENV UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir --quiet "uv==${UV_VERSION}"
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY operator ./operator
COPY model_server ./model_server
COPY modelpool_contract ./modelpool_contract
COPY modelpool_gateway ./modelpool_gateway
# --frozen: the lock as committed (a lock that disagrees with pyproject.toml fails the tests, not here).
# The worker image carries the onnx extra (a pool's spec.model.runtime: onnxruntime). The CPU variant's
# list drops torch and what only its CUDA build needs (nvidia-*, cuda-*, triton).
RUN /opt/uv/bin/uv build ${UV_CACHE_OPT} --wheel --out-dir /dist \
 && export_="/opt/uv/bin/uv export --frozen --no-emit-project --no-header --no-annotate" \
 && $export_ --extra operator --extra gateway -o /dist/operator.txt \
 && $export_ --extra server --extra onnx -o /dist/server.txt \
 && awk '/^[^ #]/ { skip = ($0 ~ /^(torch|triton|nvidia-[^=]*|cuda-[^=]*)==/) } !skip' /dist/server.txt \
      > /dist/server-cpu.txt \
 && sed -n 's/^torch==\([^ ;]*\).*/\1/p' /dist/server.txt > /dist/torch-version \
 && test -s /dist/torch-version

# ---- server: modelpool-server with torch (the worker image) --------------------------------------------
FROM base AS server
ARG SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
ARG UV_CACHE_OPT=--no-cache
ARG TORCH_INDEX_URL=
# One RUN writes the whole virtualenv (uv and the lists are mounted from the build stage, not copied), so
# the ~5 GB of site-packages land in one layer, byte-compiled: the root is read-only at run time and an
# `import transformers` without .pyc files costs tens of seconds.
RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    --mount=type=bind,from=build,source=/opt/uv,target=/opt/uv \
    set -e; \
    uv="/opt/uv/bin/uv pip install ${UV_CACHE_OPT} --link-mode=copy --compile-bytecode --python /opt/modelpool/bin/python --no-deps"; \
    python3 -m venv --without-pip /opt/modelpool; \
    if [ -n "${TORCH_INDEX_URL}" ]; then \
      $uv --index-url "${TORCH_INDEX_URL}" "torch==$(cat /dist/torch-version)"; \
      $uv --require-hashes -r /dist/server-cpu.txt; \
    else \
      $uv --require-hashes -r /dist/server.txt; \
    fi; \
    $uv /dist/*.whl
WORKDIR /home/modelpool
USER 10001:10001
# Traffic, and the probe port the operator passes (--probe-port: probes and /stats).
EXPOSE 8000 8001
ENTRYPOINT ["modelpool-server"]

# ---- operator: modelpool-operator and modelpool-gateway, no torch (the last stage: a plain `docker build`
# gives the operator; the chart runs the gateway from this image with `command: [modelpool-gateway]`) ----
FROM base AS operator
ARG SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
ARG UV_CACHE_OPT=--no-cache
RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    --mount=type=bind,from=build,source=/opt/uv,target=/opt/uv \
    set -e; \
    uv="/opt/uv/bin/uv pip install ${UV_CACHE_OPT} --link-mode=copy --compile-bytecode --python /opt/modelpool/bin/python --no-deps"; \
    python3 -m venv --without-pip /opt/modelpool; \
    $uv --require-hashes -r /dist/operator.txt; \
    $uv /dist/*.whl
WORKDIR /home/modelpool
USER 10001:10001
# kopf's liveness endpoint (GET /healthz), and the gateway's HTTP port.
EXPOSE 8080
ENTRYPOINT ["modelpool-operator"]
CMD ["--all-namespaces"]
