"""Scale-aware comparisons of an artifact's outputs with the eager reference."""

import math


def sqnr_db(reference, output):
    """Signal-to-quantization-noise ratio in dB: 10 log10(mean(ref^2) / mean((ref - out)^2)).

    Independent of the output's scale, unlike an absolute tolerance: a collapsed model (outputs ~1e-9) passes
    any absolute check while its SQNR still shows whether the artifact computes the same function.
    """
    reference = reference.detach().double().flatten()
    error = (reference - output.detach().double().flatten()).pow(2).mean().item()
    signal = reference.pow(2).mean().item()
    if error == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / error)
