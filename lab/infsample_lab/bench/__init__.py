"""Benchmarks and figures: the engine and in-verl benchmarks, the predictor evaluation, the GPU checks, plots, and
the table and progress helpers they print with. Nothing in the product imports this package."""
