"""The self-play loop (SPEC section 3): matchmake, propose, validate, solve, reward, update, rate, evolve, log,
checkpoint."""
