"""The ``agent-scheduler`` command: one entry point whose subcommands live in the packages that own them."""
