"""Rendering: rich for the terminal, HTML/Markdown files. No computation here."""
