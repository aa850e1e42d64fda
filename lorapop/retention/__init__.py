"""The operator retention study (the paper's Appendix J) and its registered verdict: a library the `lorapop retention`
command and bench/retention_table.py both use. Imports train, eval, evolve, tasks, engine, records and config; never
a command."""
