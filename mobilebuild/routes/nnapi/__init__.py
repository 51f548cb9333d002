"""Android NNAPI through PyTorch Mobile (.ptl): the route family. plan.py registers its routes and stages (torch-
free); worker/ runs them."""
