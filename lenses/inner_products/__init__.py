"""Inner products on parameter objects: the sharp maps p' ↦ (p')♯ an optimiser starts from.

`metrics` (the protocol, Euclidean, Diagonal, Constant), `natural` (Gauss–Newton and Fisher),
`kfac` (Kronecker-factored Fisher), `geometry` (metrics of open parameter objects and their
retractions) and `instruments` (what measures them).
"""
