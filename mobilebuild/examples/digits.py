"""A small CNN for scikit-learn's 8x8 digits: real images that ship inside the scikit-learn wheel.

The split is fixed (seeded): the first TRAIN_FRACTION of a permutation trains and calibrates, the rest is held out.
"""

import torch
from torch import nn

SPLIT_SEED = 0
TRAIN_FRACTION = 0.8


class DigitsCNN(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, 64), nn.ReLU(), nn.Linear(64, 10))
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        return self.dequant(self.classifier(self.features(self.quant(x))))


def load_split(part):
    """('train' | 'test') -> (images N x 1 x 8 x 8 scaled to [0, 1], labels N)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    cut = int(len(labels) * TRAIN_FRACTION)
    chosen = order[:cut] if part == "train" else order[cut:]
    return images[chosen], labels[chosen]


def train(model, epochs=10, batch_size=64, lr=0.01):
    images, labels = load_split("train")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for start in range(0, len(labels), batch_size):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images[start:start + batch_size]),
                                               labels[start:start + batch_size])
            loss.backward()
            optimizer.step()
    return model.eval()


def calibration_batches(batch_size=1):
    """Training images, in order: the calibration set never touches the held-out images."""
    images, _ = load_split("train")
    for start in range(0, len(images), batch_size):
        yield images[start:start + batch_size]


def evaluation_data():
    """The held-out images and their labels: what verify measures accuracy on."""
    return load_split("test")


def accuracy(model, part="test"):
    images, labels = load_split(part)
    with torch.no_grad():
        return (model(images).argmax(dim=1) == labels).float().mean().item()
