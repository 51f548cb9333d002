"""Training and data of the hub zoo (benchmarks/hub_zoo.py): timm and transformers models, random weights from their
configurations, trained briefly so that an int8 verdict measures the artifact rather than a random network's
amplification of rounding. Image models learn scikit-learn's digits (zoo_models.train_on_digits); text models a
small synthetic task; the speech encoder tones. Nothing is downloaded."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from zoo_models import train_on_digits


class Scores(nn.Module):
    """A transformers model (its outputs a dict, worker.hub) as train_on_digits takes it: the logits alone."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        found = self.model(x)
        return found["logits"] if isinstance(found, dict) else found


def train_image(model, size=64, steps=100, optimizer="sgd"):
    """train_on_digits for a timm or transformers image classifier (10 classes or more)."""
    train_on_digits(Scores(model), size=size, steps=steps, optimizer=optimizer)
    return model.eval()


# --- text: which half of the vocabulary most tokens come from (encoders); counting on by one (a decoder) -----------

def token_batch(count, length, vocabulary, task, generator):
    """(ids, labels): `task` "majority": random ids, labelled 1 where most come from the vocabulary's upper half;
    "count": sequences start, start + 1, ... (mod the vocabulary), labelled with themselves shifted by one."""
    if task == "count":
        starts = torch.randint(0, vocabulary, (count, 1), generator=generator)
        ids = (starts + torch.arange(length)) % vocabulary
        return ids, (ids + 1) % vocabulary
    ids = torch.randint(0, vocabulary, (count, length), generator=generator)
    return ids, ((ids >= vocabulary // 2).sum(1) * 2 > length).long()


def train_tokens(model, task="majority", length=16, vocabulary=100, steps=150, batch_size=32, lr=2e-3, seed=0):
    """AdamW on the synthetic `task` (token_batch): a sequence classifier's logits (batch x labels), or a causal
    language model's (batch x length x vocabulary) against the next token."""
    generator = torch.Generator().manual_seed(seed)
    step = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        ids, labels = token_batch(batch_size, length, vocabulary, task, generator)
        logits = model(ids)["logits"]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        step.zero_grad()
        loss.backward()
        step.step()
    return model.eval()


def token_batches(task="majority", length=16, vocabulary=100, seed=1):
    """quantize.calibration.function of the text models: one sequence of the task per batch (never the training
    seed's); calibration takes the first ones, verification (calibration-holdout) those after them."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield token_batch(1, length, vocabulary, task, generator)[0]


# --- speech: which of a few tones a noisy clip holds ----------------------------------------------------------------

TONES_HZ = (220.0, 330.0, 440.0, 660.0)


def tone_batch(count, samples, generator, rate=8000):
    labels = torch.randint(0, len(TONES_HZ), (count,), generator=generator)
    phase = torch.rand(count, 1, generator=generator) * 2 * math.pi
    time = torch.arange(samples) / rate
    frequency = torch.tensor(TONES_HZ)[labels].unsqueeze(1)
    clips = torch.sin(2 * math.pi * frequency * time + phase) + 0.3 * torch.randn(count, samples, generator=generator)
    return clips, labels


def train_tones(model, samples=4000, steps=100, batch_size=16, lr=1e-3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    step = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        clips, labels = tone_batch(batch_size, samples, generator)
        loss = F.cross_entropy(model(clips)["logits"], labels)
        step.zero_grad()
        loss.backward()
        step.step()
    return model.eval()


def tone_batches(samples=4000, seed=1):
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield tone_batch(1, samples, generator)[0]
