"""mobilebuild: PyTorch models to mobile deployment artifacts through an incremental doit graph."""

__version__ = "0.1.0"
