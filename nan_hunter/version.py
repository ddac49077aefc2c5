"""The package version (a module of its own, so that any module can read it without importing the
public API in ``nan_hunter/__init__.py``)."""

__version__ = "0.1.0"
