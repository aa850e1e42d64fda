"""The self-play loop (docs/METHOD.md, The step): matchmake, propose, validate, solve, reward, update, rate, probe,
evolve, coverage, log, checkpoint."""
