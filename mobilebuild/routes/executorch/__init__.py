"""ExecuTorch programs (.pte): XNNPACK, Vulkan, Core ML, MPS, and language models: the route family. plan.py
registers its routes and stages (torch-free); worker/ runs them."""
