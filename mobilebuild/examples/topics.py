"""A text classifier on token ids with an attention mask and a variable sequence length.

scikit-learn and scikit-image ship no text corpus, and nothing may be downloaded, so the sentences are generated,
seeded: each of four topics has its own words, every sentence mixes its topic's words with words all topics share,
and sentences run from 4 to 64 tokens, padded (id 0, mask 0) to the longest in their batch. A model that reads the
mask learns the topic; one that ignored it would count padding as words.
"""

import torch
from torch import nn

VOCABULARY = 64  # id 0 pads; ids 1-15 are shared words; each topic owns 12 of the rest
TOPICS = 4
SHARED = range(1, 16)
TOPIC_WORDS = 12
TOPIC_SHARE = 0.4  # the fraction of a sentence's words that are its topic's
LENGTHS = (4, 64)
EVALUATION_LENGTH = 32  # held-out sentences are padded to the recipe's example length
TRAIN_SEED, EVALUATION_SEED = 0, 1


class TopicClassifier(nn.Module):
    """Embeddings averaged over the unmasked tokens, then two linear layers: topic scores."""

    def __init__(self, width=32):
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, TOPICS)

    def forward(self, ids, mask):
        weights = mask.unsqueeze(-1).to(torch.float32)
        pooled = (self.embedding(ids) * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.head(torch.relu(self.hidden(pooled)))


def sentences(count, seed, length=None):
    """(ids [count, L], mask [count, L], topics [count]): `count` sentences, padded to the longest (or to `length`)."""
    generator = torch.Generator().manual_seed(seed)
    topics = torch.randint(0, TOPICS, (count,), generator=generator)
    longest = length or LENGTHS[1]
    lengths = torch.randint(LENGTHS[0], longest + 1, (count,), generator=generator)
    shared = torch.tensor(list(SHARED))
    ids = torch.zeros(count, longest, dtype=torch.int64)
    for row, (topic, size) in enumerate(zip(topics.tolist(), lengths.tolist())):
        own = torch.arange(TOPIC_WORDS) + SHARED[-1] + 1 + topic * TOPIC_WORDS
        from_topic = torch.rand(size, generator=generator) < TOPIC_SHARE
        words = torch.where(from_topic, own[torch.randint(0, TOPIC_WORDS, (size,), generator=generator)],
                            shared[torch.randint(0, len(shared), (size,), generator=generator)])
        ids[row, :size] = words
    mask = (torch.arange(longest) < lengths.unsqueeze(1)).to(torch.int64)
    return ids, mask, topics


def train(model, steps=300, batch_size=64, lr=0.02):
    ids, mask, topics = sentences(steps * batch_size // 4, TRAIN_SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        rows = torch.arange(step * batch_size, (step + 1) * batch_size) % len(topics)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(ids[rows], mask[rows]), topics[rows]).backward()
        optimizer.step()
    return model.eval()


def evaluation_data(count=256):
    """Held-out sentences (another seed) padded to the example length, with their topics: what verify measures
    accuracy on."""
    ids, mask, topics = sentences(count, EVALUATION_SEED, length=EVALUATION_LENGTH)
    return {"ids": ids, "mask": mask}, topics
