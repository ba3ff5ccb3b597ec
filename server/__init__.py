"""Ekka language server (pygls)."""
