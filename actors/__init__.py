"""Thin Ray actors around the dreamgym library."""
