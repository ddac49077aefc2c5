"""Command line (typer): parse flags, call the library, render. Nothing else."""
