"""The cuda backend."""
