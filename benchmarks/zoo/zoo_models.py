"""The zoo's own model factories: architectures users ship that torchvision has no builder for (or none small
enough to build in seconds). benchmarks/zoo.py copies this file into its scratch project, where recipes name the
factories as `zoo_models:<function>`, and the image classifiers' training as `zoo_models:train_on_digits`.
Weights are seeded random ones, briefly trained on digits for the image classifiers (see train_on_digits)."""

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.models import VisionTransformer, mobilenet_v3_small


def vit_tiny(image_size=64, patch_size=8, num_classes=100):
    """A ViT-Tiny-like VisionTransformer (DeiT-Tiny widths: 192 wide, 3 heads; 6 layers instead of 12).
    torchvision initialises the classification head to zeros (it is meant to be fine-tuned): every output would be
    0 and any artifact would match it exactly, so the head gets random weights like the other layers."""
    model = VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=6, num_heads=3,
                              hidden_dim=192, mlp_dim=768, num_classes=num_classes)
    nn.init.trunc_normal_(model.heads.head.weight, std=0.02)
    return model


class TextTransformer(nn.Module):
    """A BERT-style sentence classifier: token and position embeddings, nn.TransformerEncoder, masked mean pooling.
    Two inputs: token ids and an attention mask (1 for a token, 0 for padding). The first token (BERT's [CLS]) is
    always attended to, so that no sentence is all padding (attention over nothing is NaN)."""

    def __init__(self, vocabulary=1000, width=128, heads=4, layers=2, max_length=128, classes=4):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Parameter(torch.randn(1, max_length, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, ids, mask):
        x = self.tokens(ids) + self.positions[:, :ids.shape[1]]
        padding = (mask == 0) & (torch.arange(ids.shape[1]) > 0)
        x = self.encoder(x, src_key_padding_mask=padding)
        weights = (~padding).unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def text_transformer(**kwargs):
    return TextTransformer(**kwargs)


class LSTMClassifier(nn.Module):
    """Embedding, a two-layer LSTM, a linear head on the last step's hidden state: the classic text classifier."""

    def __init__(self, vocabulary=1000, width=64, hidden=128, layers=2, classes=4):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.lstm = nn.LSTM(width, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, ids):
        out, _ = self.lstm(self.tokens(ids))
        return self.head(out[:, -1])


def lstm_classifier(**kwargs):
    return LSTMClassifier(**kwargs)


class M5(nn.Module):
    """M5 (Dai et al. 2017, the torchaudio keyword-spotting tutorial's network): 1-D convolutions on raw audio
    [batch, 1, samples], 35 speech commands."""

    def __init__(self, classes=35, channels=32, stride=16):
        super().__init__()

        def block(cin, cout, kernel, conv_stride=1):
            return [nn.Conv1d(cin, cout, kernel, stride=conv_stride), nn.BatchNorm1d(cout), nn.ReLU(),
                    nn.MaxPool1d(4)]

        self.features = nn.Sequential(*block(1, channels, 80, stride), *block(channels, channels, 3),
                                      *block(channels, 2 * channels, 3), *block(2 * channels, 2 * channels, 3),
                                      nn.AdaptiveAvgPool1d(1))
        self.head = nn.Linear(2 * channels, classes)

    def forward(self, audio):
        return self.head(torch.flatten(self.features(audio), 1))


def m5(**kwargs):
    return M5(**kwargs)


class ImageWithMetadata(nn.Module):
    """Two inputs: an image through a small CNN and a feature vector (the app's metadata) through an MLP,
    concatenated before the classifier, as in product or skin-lesion classifiers."""

    def __init__(self, features=16, classes=10):
        super().__init__()

        def conv(cin, cout):
            return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.image = nn.Sequential(*conv(3, 16), *conv(16, 32), *conv(32, 64), *conv(64, 64),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.metadata = nn.Sequential(nn.Linear(features, 32), nn.ReLU())
        self.head = nn.Linear(64 + 32, classes)

    def forward(self, image, metadata):
        return self.head(torch.cat([self.image(image), self.metadata(metadata)], dim=1))


def image_with_metadata(**kwargs):
    return ImageWithMetadata(**kwargs)


class ClassifyAndLocate(nn.Module):
    """Two outputs: torchvision's MobileNetV3-Small features with a class head and a box-regression head (one
    object: class scores and its box), the single-object detector of many apps."""

    def __init__(self, classes=20):
        super().__init__()
        self.backbone = mobilenet_v3_small(weights=None).features
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classes = nn.Linear(576, classes)
        self.box = nn.Sequential(nn.Linear(576, 128), nn.ReLU(), nn.Linear(128, 4))

    def forward(self, image):
        x = torch.flatten(self.pool(self.backbone(image)), 1)
        return self.classes(x), self.box(x)


def classify_and_locate(**kwargs):
    return ClassifyAndLocate(**kwargs)


def ink_boxes(images):
    """The box around each digit's ink, (x0, y0, x1, y1) as fractions of the image's width and height: images
    N x 1 x H x W in [0, 1] -> N x 4."""
    ink = images[:, 0] > 0
    columns, rows = ink.any(dim=1), ink.any(dim=2)  # N x W, N x H

    def extent(mask):
        index = torch.arange(mask.shape[1]).expand_as(mask)
        first = torch.where(mask, index, mask.shape[1]).amin(dim=1)
        last = torch.where(mask, index, -1).amax(dim=1) + 1
        return first / mask.shape[1], last / mask.shape[1]

    (x0, x1), (y0, y1) = extent(columns), extent(rows)
    return torch.stack([x0, y0, x1, y1], dim=1)


def upscaled_digits(images, size):
    """Digits N x 1 x 8 x 8 as the zoo's image classifiers take them: bilinearly upscaled to size x size, 3 channels."""
    upscaled = F.interpolate(images, size=(size, size), mode="bilinear").expand(-1, 3, -1, -1)
    return upscaled.contiguous(memory_format=torch.channels_last)


def digits_batches(size=112):
    """quantize.calibration.function of the trained classifiers: the training split's digits, one per batch, in
    order. Calibration reads the first `batches`; verify.evaluation: calibration-holdout verifies on the ones after
    them, where the trained model's outputs vary from image to image (on random images they barely do)."""
    from mobilebuild.examples.digits import load_split

    images, _ = load_split("train")
    for index in range(len(images)):
        yield upscaled_digits(images[index:index + 1], size)


def train_on_digits(model, size=112, steps=150, batch_size=32, optimizer="sgd", lr=None, weight_decay=1e-4,
                    batchnorm_batches=8, seed=0):
    """A few steps of training on scikit-learn's digits (mobilebuild's example split, images in [0, 1]), bilinearly
    upscaled to size x size and copied to 3 channels. A randomly initialised batch-norm network amplifies any
    perturbation (int8 rounding among them) far beyond what a trained one does; this much training tames it.

    optimizer: "sgd" (lr 0.05, momentum 0.9) for the convolutional networks, "adamw" (lr 1e-3) for those trained
    with it (Transformers, ConvNeXt: SGD leaves them untrained). Then batch-norm statistics are re-estimated on
    `batchnorm_batches` batches of digits, a cumulative average, with the weights fixed ("precise BN"): the running
    averages of a few steps lag the moving weights (MobileNetV3's momentum is 0.01), and without it the eval-mode
    model gives nearly the same output for every input. The recipe's batchnorm_stats stays 0.

    The first output gets cross-entropy on the digit's label (it needs 10 classes or more); any further output must
    be 4 wide and gets smooth L1 towards the digit's ink box (x0, y0, x1, y1 in [0, 1]), so every head is trained.
    Seeded (batch order, dropout) and deterministic for a given thread count."""
    from mobilebuild.examples.digits import load_split

    images, labels = load_split("train")
    boxes = ink_boxes(images)
    torch.manual_seed(seed)
    order = torch.Generator().manual_seed(seed)

    if optimizer == "sgd":
        step = torch.optim.SGD(model.parameters(), lr=lr or 0.05, momentum=0.9, weight_decay=weight_decay)
    elif optimizer == "adamw":
        step = torch.optim.AdamW(model.parameters(), lr=lr or 1e-3, weight_decay=weight_decay)
    else:
        raise ValueError(f"train_on_digits: optimizer is 'sgd' or 'adamw', got {optimizer!r}")
    model.train()
    for _ in range(steps):
        chosen = torch.randint(0, len(labels), (batch_size,), generator=order)
        outputs = model(upscaled_digits(images[chosen], size))
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        loss = F.cross_entropy(outputs[0], labels[chosen])
        for index, output in enumerate(outputs[1:], 1):
            if output.shape != (batch_size, 4):
                raise ValueError(f"train_on_digits trains a further output as a box (batch x 4); output {index} "
                                 f"is {tuple(output.shape)}")
            loss = loss + F.smooth_l1_loss(output, boxes[chosen], beta=0.1)
        if not torch.isfinite(loss):
            raise ValueError(f"train_on_digits diverged (loss {loss.item()}): lower lr")
        step.zero_grad()
        loss.backward()
        step.step()

    model.eval()
    norms = [module for module in model.modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)]
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average
        norm.train()  # the rest (dropout, stochastic depth) stays in eval mode
    with torch.no_grad():
        for _ in range(batchnorm_batches if norms else 0):
            model(upscaled_digits(images[torch.randint(0, len(labels), (batch_size,), generator=order)], size))
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    return model.eval()
