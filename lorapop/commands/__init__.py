"""The commands: one module per ``lorapop`` subcommand (its arguments, the run directory it prepares, the glue that
calls the library). The top floor under lorapop/cli.py: a command may import any library package and another
command; nothing in the library imports a command. Each module imports its heavy parts when it runs."""
