"""The command-line front ends: ``berm`` (subcommands, one module each) and ``berm-compile``."""
