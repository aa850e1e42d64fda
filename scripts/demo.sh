#!/usr/bin/env bash
# The README's main command: set everything up, then run the CPU demo (a 2T+2S population on the embedded
# SmolLM2-135M-Instruct for a few steps, with a PBT replacement) and write its report.
# Extra arguments are config overrides, e.g. `bash scripts/demo.sh --run.steps=5`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
name="cpu_demo-$(date +%Y%m%d-%H%M%S)"
.venv/bin/lorapop train cpu_demo --run.name="$name" "$@"
.venv/bin/lorapop report "runs/$name"
echo "run directory: runs/$name (open runs/$name/report.html in a browser)"
