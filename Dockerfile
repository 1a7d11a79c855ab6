# syntax=docker/dockerfile:1.7
# modelpool images, one Dockerfile, two targets:
#   docker build --target operator -t ghcr.io/modelpool/modelpool-operator:0.1.0 .   (operator + gateway, no torch)
#   docker build --target server   -t ghcr.io/modelpool/modelpool-server:0.1.0 .     (model server, torch)
# Both run as the non-root user 10001 (the chart's and the worker pods' restricted securityContext).
# `make e2e-kind` builds both and loads them into a kind cluster.

ARG PYTHON_VERSION=3.11

# ---- base: slim Python and the unprivileged user -------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 modelpool \
 && useradd --system --uid 10001 --gid modelpool --home-dir /home/modelpool --create-home modelpool

# ---- build: one wheel of the project (every package and console script) --------------------------------
FROM base AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY model_server ./model_server
COPY modelpool_contract ./modelpool_contract
COPY modelpool_gateway ./modelpool_gateway
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- server: modelpool-server with torch (the worker image) --------------------------------------------
FROM base AS server
# CUDA wheels by default; --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for a CPU image.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch>=2.4"
COPY --from=build /wheels /wheels
RUN pip install "$(echo /wheels/modelpool-*.whl)[server]" && rm -rf /wheels
# Downloads of hf:// sources land here: the operator's worker pods set the same HF_HOME and mount an
# emptyDir on /cache; without a volume (plain `docker run`) any uid may still write it.
ENV HF_HOME=/cache/huggingface
RUN mkdir -p /cache/huggingface && chmod -R 1777 /cache
WORKDIR /home/modelpool
USER 10001:10001
# Traffic, and the probe port the operator passes (--probe-port: probes and /stats).
EXPOSE 8000 8001
ENTRYPOINT ["modelpool-server"]

# ---- operator: modelpool-operator and modelpool-gateway, no torch (the last stage: a plain `docker build`
# gives the operator; the chart runs the gateway from this image with `command: [modelpool-gateway]`) ----
FROM base AS operator
COPY --from=build /wheels /wheels
RUN pip install "$(echo /wheels/modelpool-*.whl)[operator,gateway]" && rm -rf /wheels
WORKDIR /home/modelpool
USER 10001:10001
# kopf's liveness endpoint (GET /healthz), and the gateway's HTTP port.
EXPOSE 8080
ENTRYPOINT ["modelpool-operator"]
CMD ["--all-namespaces"]
