# shmserve serving a model repository mounted at /models.
#
#   CPU:   docker build -t shmserve .
#   CUDA:  docker build -t shmserve:cuda \
#            --build-arg BASE_IMAGE=nvidia/cuda:13.0.0-base-ubuntu24.04 \
#            --build-arg EXTRAS=gpu .
#   run:   docker run --rm --shm-size=1g -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#            -v $PWD/models:/models shmserve        (CUDA: add --gpus all)
#
# --shm-size: tensors move between the server's processes in /dev/shm, and Docker's
# default 64 MiB is less than one process's arena (--arena-mib) times the processes.
# EXTRAS picks the onnxruntime build: cpu or gpu (never both); add pytorch for
# TorchScript models (e.g. EXTRAS=cpu,pytorch).
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}

ARG EXTRAS=cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/shmserve/bin:$PATH

# CUDA base images bring no Python: install the distribution's. Any base with python3
# (3.10+), its venv module and useradd will do, e.g. a Debian root filesystem that
# scripts/container_check builds with mmdebstrap where Docker Hub is out of reach.
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
        --no-install-recommends python3 python3-venv && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/shmserve

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY frontend ./frontend
COPY scheduler ./scheduler
COPY shm ./shm
COPY workers ./workers
# A pip.conf passed as the build secret `pipconf` (a private index or mirror) is read
# for this step only and never stored in a layer; without it pip uses PyPI. e.g.
#   docker build --secret id=pipconf,src=$HOME/.config/pip/pip.conf .
RUN --mount=type=secret,id=pipconf,target=/etc/pip.conf \
    pip install --upgrade pip && pip install ".[${EXTRAS}]" && rm -rf /src

# the server runs unprivileged; the repository is read-only to it
RUN useradd --create-home --uid 10001 shmserve && mkdir -p /models
USER shmserve
WORKDIR /home/shmserve

EXPOSE 8000 8001 8002
VOLUME ["/models"]
# asks /v2/health/ready on the port the server was started with (read from its
# command line), so `docker run IMAGE --http-port=9000 ...` is healthy too
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s \
  CMD ["python3", "-m", "scheduler.healthcheck"]
ENTRYPOINT ["shmserve"]
CMD ["--model-repository=/models", "--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"]
