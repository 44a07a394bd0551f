"""The package version (its own module so that every layer can import it without importing the public API)."""

__version__ = "0.1.0"
