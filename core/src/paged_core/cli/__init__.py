"""The ``paged`` command line: :mod:`paged_core.cli.main` plus one module per subcommand."""
