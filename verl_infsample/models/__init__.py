"""Small offline models for tests and demos (see :mod:`verl_infsample.models.tiny`)."""
