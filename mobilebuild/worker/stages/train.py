"""train: run the recipe's training function on a freshly initialised model; its weights become the checkpoint."""

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import modeling


def run(inputs, config, output):
    model = modeling.build_model(config.model, config.seed)
    train = modeling.resolve_callable(config.train["function"], field="model.train.function")
    torch.manual_seed(config.seed)
    try:
        trained = train(model, **config.train["kwargs"])
    except MobileBuildError:
        raise
    except Exception as exc:  # the user's training code
        raise MobileBuildError(f"training raised {type(exc).__name__}: {modeling.first_line(exc)}",
                               field="model.train.function") from None
    model = trained if isinstance(trained, torch.nn.Module) else model
    modeling.save(model.state_dict(), output)
