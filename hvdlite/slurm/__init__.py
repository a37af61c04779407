"""Slurm tools run as commands: `python -m hvdlite.slurm hosts`."""
