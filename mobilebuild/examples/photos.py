"""Real photographs for ImageNet-style models, from a package (nothing can be downloaded here): scikit-learn's two
sample images, china.jpg and flower.jpg (427 x 640 each). Models see crops of them at random positions and scales,
resized to the input size and normalised with ImageNet's mean and std, as torchvision's models expect. Calibration
reads crops of one photograph and verification crops of the other, so an artifact is never verified on the image
it was calibrated on."""

import numpy as np
import torch
import torch.nn.functional as F

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
CALIBRATION, EVALUATION = 0, 1  # indices into load_sample_images(): china.jpg, flower.jpg


def _photo(index):
    from sklearn.datasets import load_sample_images  # only when a stage reads photos

    return torch.from_numpy(load_sample_images().images[index].copy()).permute(2, 0, 1).float() / 255


def crops(index, count, seed, size=224):
    """`count` crops of photo `index`: squares from `size` pixels to the photo's height, flipped at random,
    resized to size x size, normalised; a tensor of shape [count, 3, size, size]."""
    photo = _photo(index)
    _, height, width = photo.shape
    generator = np.random.default_rng(seed)
    found = []
    for _ in range(count):
        side = int(generator.integers(min(size, height), height + 1))
        top, left = int(generator.integers(0, height - side + 1)), int(generator.integers(0, width - side + 1))
        crop = F.interpolate(photo[None, :, top:top + side, left:left + side], size=(size, size), mode="bilinear",
                             antialias=True, align_corners=False)[0]
        if generator.random() < 0.5:
            crop = crop.flip(-1)
        found.append((crop - MEAN) / STD)
    return torch.stack(found)


def calibration_batches(batch_size=1, count=64, seed=0):
    """Crops of china.jpg, `batch_size` at a time."""
    images = crops(CALIBRATION, count, seed)
    for start in range(0, count, batch_size):
        yield images[start:start + batch_size]


def evaluation_data(samples=64, seed=1):
    """Crops of flower.jpg, the photograph calibration never reads (no labels: the model's own classes are
    compared with eager fp32's)."""
    return crops(EVALUATION, samples, seed)
