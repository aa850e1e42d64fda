"""lorapop: population-based asymmetric self-play (PopuLoRA) for RLVR with LoRA adapters on one frozen base."""

__version__ = "0.1.0"
