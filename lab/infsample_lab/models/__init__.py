"""Small offline models for tests and demos (see :mod:`infsample_lab.models.tiny`)."""
