"""The self-play loop (docs/METHOD.md, The step): matchmake, propose, validate, solve, reward, update, rate, probe,
evolve, coverage, log, checkpoint. Imports config, tasks, evolve, engine, executor, records and the floors below;
never a command."""
