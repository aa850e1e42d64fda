"""The engine a config asks for: the one place that knows the backends (the trainer, eval and retention call it)."""

from __future__ import annotations

from .base import Engine, EngineConfig


def make_engine(model_name: str, n_adapters: int, cfg: EngineConfig, seed: int = 0) -> Engine:
    """``engine.replicas > 1``: Ray replicas of TorchEngine; ``engine.backend: vllm``: a TorchEngine for the update
    behind a vLLM engine for generation; else one TorchEngine."""
    cfg.validate()
    if cfg.replicas > 1:
        from .replicas import ReplicatedEngine

        return ReplicatedEngine(model_name, n_adapters, cfg, seed=seed)
    if cfg.backend == "vllm":
        from .vllm_engine import VLLMUnavailable, refuse_second_engine, vllm_missing

        missing = vllm_missing()  # before the base model loads: the error comes in seconds
        if missing:
            raise VLLMUnavailable(f"engine.backend vllm: {missing}; or set engine.backend=torch")
        refuse_second_engine()
    from .torch_engine import TorchEngine

    trainer = TorchEngine.from_config(model_name, n_adapters, cfg, seed=seed)
    if cfg.backend != "vllm":
        return trainer
    from lorapop.model import prepare_model

    from .vllm_engine import VLLMEngine

    try:
        return VLLMEngine(trainer, str(prepare_model(model_name)), cfg)
    except BaseException:
        trainer.close()
        raise

