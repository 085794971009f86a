"""Layers: the parameterised lenses networks are written with.

`basic` (dense, convolutions, pooling, activations), `sequence` (normalisation, attention,
transformer blocks), `recurrent` (cells and their unrolling) and `discrete` (tokens,
embeddings, dropout's keys).
"""
