"""The self-play loop (docs/METHOD.md, The step): matchmake, propose, validate, solve, reward, update, rate, probe,
evolve, coverage, log, checkpoint. Floor 4: imports config, tasks, evolve, engine, executor, the memory plan and the
bottom floor; never a command. members.py (Member and its kin) sits on the bottom floor."""
