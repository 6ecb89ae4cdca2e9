"""Strategies propose points of a template's space from the history; they never touch a device."""
