"""Damaged folders, bad calls and bad flags: one clear error each, and nothing written or lost."""
