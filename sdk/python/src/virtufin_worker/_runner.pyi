# The real runner (engines/python/runner.py) is a script, not a module: the
# harness runs its source with `python -c`. This stub keeps type checkers
# from analysing the untyped script (a .pyi takes precedence over the .py).
