"""Precision bisection: which modules must stay in higher precision (``nanhunter bisect``)."""
