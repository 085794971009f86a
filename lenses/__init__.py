"""Parameterised lenses (P, f, f'): layers with a derived backward part, and learning built on them."""
