"""LoRA weight-space evolution: operators (docs/METHOD.md, Operators) and PBT replacement (docs/METHOD.md, Evolve).

Import the submodules directly (``lorapop.evolve.operators``, ``.pbt``, ``.config``, ``.svd``); this package imports
nothing heavy at import time.
"""
