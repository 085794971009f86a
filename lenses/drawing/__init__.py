"""Drawings of lenses: `diagrams` (the expression, the string diagram and its drawing), laid out
from the picture terms each lens gives (`lenses.picture`); importing it registers how a lens
shows itself in a notebook."""
