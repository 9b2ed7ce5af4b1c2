"""The ``python -m dse.study`` command line."""
