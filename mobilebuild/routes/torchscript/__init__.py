"""PyTorch Mobile through TorchScript (.ptl): XNNPACK fp32, QNNPACK int8, Vulkan and Metal: the route family.
plan.py registers its routes and stages (torch-free); worker/ runs them."""
