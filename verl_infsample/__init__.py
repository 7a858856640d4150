"""verl-infsample."""
