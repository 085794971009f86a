"""The version of the distribution paralens, read by pyproject.toml and both packages."""

__version__ = "0.1.0"
