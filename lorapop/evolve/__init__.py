"""LoRA weight-space evolution only: operators (docs/METHOD.md, Operators) and PBT replacement (docs/METHOD.md,
Evolve). Floor 2: imports only itself, the engine's types and configlib (a test holds it to that); nothing heavy at
import time: import the submodules (``.operators``, ``.pbt``, ``.config``, ``.svd``)."""
