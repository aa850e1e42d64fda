"""`lorapop plan CONFIG --backends torch,vllm`: one plan per backend, each the plan that
`--engine.backend=B` alone gives, and an exit status that is 0 only when every one fits."""

from __future__ import annotations

import pytest

from lorapop.plan import gpu as planmod
from lorapop.cli import main

SHORT = ["--prompt-tokens", "128", "--selfplay.propose.max_new_tokens=64", "--selfplay.solve.max_new_tokens=64",
         "--engine.train_micro_batch_size=2"]


@pytest.mark.slow  # runs the CLI (fake tensors at the embedded shape)
def test_both_backends_in_one_call(monkeypatch, capsys):
    real, measured = planmod.measure, {}

    def once(cfg, prompt_tokens=planmod.DEFAULT_PROMPT_TOKENS):  # each backend measured once, then reused
        key = (cfg.engine.backend, prompt_tokens)
        if key not in measured:
            measured[key] = real(cfg, prompt_tokens)
        return measured[key]

    monkeypatch.setattr(planmod, "measure", once)
    alone = {}
    for backend in ("torch", "vllm"):
        assert main(["plan", "cpu_demo", f"--engine.backend={backend}", *SHORT]) == 0
        alone[backend] = capsys.readouterr().out.strip()
    assert main(["plan", "cpu_demo", "--backends", "torch,vllm", *SHORT]) == 0
    both = capsys.readouterr().out.strip()
    assert both == alone["torch"] + "\n\n" + alone["vllm"] and "backend vllm" in alone["vllm"]
    assert sorted(measured) == [("torch", 128), ("vllm", 128)]  # measured under each backend, not one for both
    # on a 1 GiB card vLLM's share (0.3) cannot hold its own copy of the base and a KV row: not every plan fits
    assert main(["plan", "cpu_demo", "--backends", "torch,vllm", "--gpu-memory", "1", *SHORT]) == 1
    assert main(["plan", "cpu_demo", "--backends", "torch,sglang", *SHORT]) == 2
    assert "engine.backend" in capsys.readouterr().err
