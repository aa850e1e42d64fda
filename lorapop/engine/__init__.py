"""The multi-LoRA engine: the Engine Protocol (base.py), TorchEngine and its parts, vLLM, Ray replicas. Floor 1: imports
only the bottom floor (model, hostmem, progress, raycluster, tmpdirs). ``TorchEngine`` is imported lazily so that
``lorapop.engine.base`` stays torch-free."""

from .base import DEFAULT_TARGET_MODULES, Completion, Engine, EngineConfig, SamplingParams, TrainSample

__all__ = ["DEFAULT_TARGET_MODULES", "Completion", "Engine", "EngineConfig", "SamplingParams", "TorchEngine",
           "TrainSample"]


def __getattr__(name: str):
    if name == "TorchEngine":
        from .torch_engine import TorchEngine

        return TorchEngine
    raise AttributeError(name)
