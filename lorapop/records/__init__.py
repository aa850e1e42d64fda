"""The run's records: the run directory (rundir.py), its members (members.py), the probe's readers (probe.py) and a
run read back whole for the report (run_data.py). Imports only faults and the standard library (yaml lazily);
everything that writes or reads a run (train, eval, report, criteria, commands) imports it from above."""


class RunDirError(Exception):
    """A run directory, checkpoint or adapter that is missing or unusable (the message names the path)."""
