"""Lenses to and from other libraries: `external` (Equinox, Flax, plain functions) and
`discopy_bridge` (DisCoPy diagrams and TikZ)."""
