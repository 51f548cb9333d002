"""Stages: each module has `run(inputs, config, output)`, a plain function from input artifacts and the stage's
slice of the recipe to one output file. Stages know tensors, never doit; user mistakes raise MobileBuildError
with the recipe field at fault (the caller adds the recipe file)."""
