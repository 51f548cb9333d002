"""LiteRT models (.tflite): XNNPACK CPU, GPU and NPU delegates, and language models: the route family. plan.py
registers its routes and stages (torch-free); worker/ runs them."""
