"""Tests of the .mnn reader and weight decoding against the real exporter's files."""
