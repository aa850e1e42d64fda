"""The memory plan: each phase of a run measured on fake tensors (measure.py), the GPU plan and its fit check (gpu.py),
a CPU run's peak resident memory (cpu.py). Imports the engine, tasks, the config and the bottom floor; never a command.
The names below are the package's door; cpu.py is imported as lorapop.plan.cpu (it loads what a CPU run loads)."""

from lorapop.plan.gpu import (GIB, HEADROOM, HOST_LINK_BYTES_S, MemoryPlan, assemble, check_fits, check_on_cuda,
                              engine_kv_cache, plan, vllm_sleep_seconds)
from lorapop.plan.measure import (AZR_PROMPT_TOKENS, DEFAULT_PROMPT_TOKENS, PROBE_LAYERS, REPLY_TOKENS, SHAPES,
                                  Measured, PlanError, UnknownShape, default_prompt_tokens, measure, measure_phases,
                                  model_config, vllm_graph_capture_tokens)

__all__ = ["AZR_PROMPT_TOKENS", "DEFAULT_PROMPT_TOKENS", "GIB", "HEADROOM", "HOST_LINK_BYTES_S", "PROBE_LAYERS",
           "REPLY_TOKENS", "SHAPES", "Measured", "MemoryPlan", "PlanError", "UnknownShape", "assemble", "check_fits",
           "check_on_cuda", "default_prompt_tokens", "engine_kv_cache", "measure", "measure_phases", "model_config",
           "plan", "vllm_graph_capture_tokens", "vllm_sleep_seconds"]
