"""ONNX models (.onnx) run by ONNX Runtime, and language models: the route family. plan.py registers its routes and
stages (torch-free); worker/ runs them."""
