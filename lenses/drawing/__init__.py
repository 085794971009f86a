"""Pictures of lenses: `picture` (what a lens shows of itself) and `diagrams` (the expression,
the string diagram and its drawing)."""
