"""Small models with the layouts that matter, importable by recipe factories in tests ("tiny_models:...")."""

import torch
from torch import nn

from mobilebuild.worker.stages import modeling


def randomize_batchnorm(model, seed=0):
    """Non-trivial batch-norm statistics: the defaults (mean 0, var 1, weight 1, bias 0) hide folding bugs."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator) * 2)
            module.running_var.copy_(torch.rand(n, generator=generator) * 3 + 0.2)
            module.weight.data.copy_(torch.randn(n, generator=generator))
            module.bias.data.copy_(torch.randn(n, generator=generator) * 2)
    return model.eval()


def stored_fused(model, path, factory=None):
    """Store the fused `model` as the fuse stage does (its weights only) and return the config fields the stages
    after fuse rebuild it from: the factory of the unfused model (by default its class) and `fuse: auto`."""
    modeling.save(model.state_dict(), path)
    return {"model": {"factory": factory or f"{type(model).__module__}:{type(model).__qualname__}"}, "fuse": "auto"}


class ConvBn(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, bias=False), nn.BatchNorm2d(8))


class SelfFusing(ConvBn):
    """Declares its own fusion, and leaves one Conv-BN pair out of it."""

    def fuse_model(self):
        torch.ao.quantization.fuse_modules(self, [["0", "1", "2"]], inplace=True)


class Branchy(nn.Module):
    """FX cannot trace it (control flow on a traced value), and no nn.Sequential shows the Conv-BN pair."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        if x.dim() == 4:
            return self.bn(self.conv(x))
        return x


class BranchySequential(nn.Module):
    """FX cannot trace it, but its Conv-BN-ReLU sits in an nn.Sequential."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU())

    def forward(self, x):
        if x.dim() == 4:
            return self.features(x)
        return x


def conv_bn():
    return randomize_batchnorm(ConvBn())


def branchy():
    return randomize_batchnorm(Branchy())


def branchy_sequential():
    return randomize_batchnorm(BranchySequential())


def self_fusing():
    return randomize_batchnorm(SelfFusing())


class BrokenConv(nn.Module):
    """Three convolutions, the middle one broken for int8: its weights from an input channel that is always zero
    (the first convolution's channel 7, a ReLU of -1) are 100, where the others are about 0.1. In float they add
    nothing; in int8 they set the weights' scale (per tensor or per output channel alike), and the convolution's
    real weights round to zero. The layers after it are sound."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                                      nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


def broken_conv():
    model = BrokenConv()
    with torch.no_grad():
        model.features[0].weight[7] = 0.0
        model.features[0].bias[7] = -1.0
        model.features[2].weight[:, 7] = 100.0
    return model.eval()



class TinyTransformer(nn.Module):
    """A BERT-style classifier on token ids, [1, seq]: token and position embeddings, one pre-norm encoder block
    (multi-head self-attention through scaled_dot_product_attention, a GELU MLP), mean pooling and a Linear head.
    Written out rather than nn.TransformerEncoderLayer, whose fused fast path (eval mode without grad) has no
    ExecuTorch kernel: the build's stages turn it off (worker.reproducible.plain_attention), a stage called directly
    as in these tests does not. Static int8 quantizes its activations poorly (LayerNorm outputs, the residual
    stream); dynamic int8 suits it."""

    def __init__(self, vocabulary=100, width=32, heads=2, max_length=32, classes=4):
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Parameter(torch.randn(1, max_length, width) * 0.02)
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.head = nn.Linear(width, classes)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions[:, :ids.shape[1]]
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).flatten(2))
        x = x + self.mlp(self.norm2(x))
        return self.head(x.mean(dim=1))


def tiny_transformer():
    torch.manual_seed(0)
    return TinyTransformer().eval()


class TinyEncoder(nn.Module):
    """The zoo's text_transformer, small: token ids and an attention mask (1 for a token, 0 for padding), token and
    position embeddings, nn.TransformerEncoder (MultiheadAttention inside: F.multi_head_attention_forward, and the
    padding mask turned into an additive float mask of 0 and -inf), masked mean pooling, a Linear head. The first
    token is always attended to (attention over nothing is NaN)."""

    def __init__(self, vocabulary=100, width=32, heads=2, layers=1, max_length=32, classes=4):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Parameter(torch.randn(1, max_length, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, ids, mask):
        x = self.tokens(ids) + self.positions[:, :ids.shape[1]]
        padding = (mask == 0) & (torch.arange(ids.shape[1]) > 0)
        x = self.encoder(x, src_key_padding_mask=padding)
        weights = (~padding).unsqueeze(-1).to(x.dtype)
        return self.head((x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0))


def tiny_encoder():
    torch.manual_seed(0)
    return TinyEncoder().eval()


class TinyLSTM(nn.Module):
    """The zoo's LSTM text classifier, small: token ids [1, seq], an embedding, a two-layer nn.LSTM, a Linear head on
    the last step. torch.export unrolls the LSTM over the example's steps; the TorchScript ONNX exporter keeps each
    layer one ONNX LSTM of any length."""

    def __init__(self, vocabulary=100, width=16, hidden=32, layers=2, classes=4):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.lstm = nn.LSTM(width, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, ids):
        steps, _ = self.lstm(self.tokens(ids))
        return self.head(steps[:, -1])


def tiny_lstm():
    torch.manual_seed(0)
    return TinyLSTM().eval()


class TinyHardswish(nn.Module):
    """MobileNetV3's activation as torchvision writes it, nn.Hardswish(inplace=True), after each Conv-BN; global
    pooling and a Linear head. Eager mode has no stubs for it: the quantize stage quantizes it in FX graph mode."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                      nn.Hardswish(inplace=True), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(8), nn.Hardswish(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


def tiny_hardswish():
    torch.manual_seed(0)
    return randomize_batchnorm(TinyHardswish())


# Every target this host builds and runs, one per route and precision, named as the zoo's columns
HOST_TARGETS = [{"backend": "xnnpack"}, {"backend": "qnnpack"},
                {"backend": "xnnpack", "runtime": "executorch", "name": "et-fp32"},
                {"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "name": "et-int8"},
                {"backend": "onnx", "name": "onnx-fp32"}, {"backend": "onnx", "precision": "int8", "name": "onnx-int8"},
                {"backend": "xnnpack", "runtime": "litert", "name": "litert-fp32"},
                {"backend": "xnnpack", "runtime": "litert", "precision": "int8", "name": "litert-int8"}]


class ConvNet(nn.Module):
    """Conv-BN-ReLU twice, global pooling and a classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))
