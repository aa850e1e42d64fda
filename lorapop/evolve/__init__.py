"""LoRA weight-space evolution: operators (SPEC section 4) and PBT replacement (SPEC section 3 step 8).

Import the submodules directly (``lorapop.evolve.operators``, ``.pbt``, ``.config``, ``.svd``); this package imports
nothing heavy at import time.
"""
