"""ncnn models (Tencent's ncnn runtime; .param and .bin, converted by its PyTorch converter pnnx, zipped): its CPU
path and its Vulkan compute path: the route family. plan.py registers its routes and stage (torch-free); worker/ runs
them."""
