"""Inputs bound to forward's parameters by name: a recipe input named like a parameter of forward is passed as that
keyword, the others by position, in the recipe's order. GPT-2's forward takes its cache before attention_mask, so a
recipe's [input_ids, attention_mask] reaches it only by name.

Every stage and route calls a model with the recipe's inputs by position, and every artifact takes them so (ONNX
names them). A model whose binding by name differs from the positional one gets a forward of its own that takes
the recipe's inputs in order and passes them on by name: its class is swapped for a subclass of the same name, so
module paths (quantize.exclude, fuse, the per-layer diagnosis) and state_dict keys stay the model's. That forward
traces (torch.jit.trace), exports (torch.export, ONNX, ExecuTorch) and scripts (its source is registered with
linecache, and the model's own forward is compiled as the method it calls).
"""

import functools
import inspect
import itertools
import keyword
import linecache
import types

from mobilebuild.errors import MobileBuildError

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
RESERVED = {"self", "torch", "Tensor", "List", "Tuple", "Dict", "Optional"}  # words TorchScript source reads itself
_COUNTER = itertools.count()


def identifiers(names):
    """The names as forward's parameters in generated source: arg_<i> for one TorchScript would read as something
    else (a keyword, self, torch)."""
    return [name if name not in RESERVED and not keyword.iskeyword(name) else f"arg_{index}"
            for index, name in enumerate(names)]


def binding(model, names):
    """(positional, by name): the recipe's input names split into those passed by position and those passed as
    the keyword of forward's parameter of that name; one line naming `inputs` where forward cannot take them."""
    signature = inspect.signature(model.forward)
    parameters = signature.parameters
    by_name = [name for name in names if name in parameters and parameters[name].kind in BY_NAME]
    positional = [name for name in names if name not in by_name]
    try:
        signature.bind(*positional, **dict.fromkeys(by_name))
    except TypeError as exc:
        takes = ", ".join(name for name in parameters if name != "kwargs")
        raise MobileBuildError(f"forward({takes}) cannot take the inputs {', '.join(names)} ({exc}): name each input "
                               "like the parameter it feeds", field="inputs") from None
    return positional, by_name


def same_as_positional(model, names, positional, by_name):
    """Whether passing every input by position binds each one to the same parameter as this binding does."""
    order = [name for name, parameter in inspect.signature(model.forward).parameters.items()
             if parameter.kind in POSITIONAL]
    ours = {**dict(zip(positional, order)), **{name: name for name in by_name}}
    return len(order) >= len(names) and dict(zip(names, order)) == ours


def bind(model, names, convert=None):
    """`model`, its forward taking the inputs `names` by position and passing them on by name where forward has a
    parameter of that name. `convert`: a function its outputs pass through (transformers' output classes to plain
    dicts), which makes the forward of its own needed whatever the binding."""
    positional, by_name = binding(model, names)
    if convert is None and same_as_positional(model, names, positional, by_name):
        return model
    base = type(model)
    parameters = identifiers(names)
    local = dict(zip(names, parameters))
    arguments = [local[name] for name in positional] + [f"{name}={local[name]}" for name in by_name]
    call = f"self.forward_by_name({', '.join(arguments)})"
    filename = f"<mobilebuild named inputs {next(_COUNTER)}>"
    source = (f"def forward(self, {', '.join(parameters)}):\n"
              f"    return {'convert(' + call + ')' if convert else call}\n")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"convert": convert}
    exec(compile(source, filename, "exec"), namespace)
    bound = type(base.__name__, (base,), {"forward": namespace["forward"], "forward_by_name": renamed(base.forward),
                                         "__module__": base.__module__, "__qualname__": base.__qualname__})
    model.__class__ = bound
    return model


def unbound(model):
    """A model `bind` gave a forward of its own, with its own forward back (the same object)."""
    base = type(model)
    if "forward_by_name" in vars(base):
        model.__class__ = base.__bases__[0]
    return model


def renamed(function, name="forward_by_name"):
    """The model's own forward under another name: TorchScript compiles a method by its function's name, and two
    named forward would clash."""
    copy = types.FunctionType(function.__code__, function.__globals__, name, function.__defaults__,
                              function.__closure__)
    functools.update_wrapper(copy, function)
    copy.__name__ = name
    del copy.__wrapped__  # TorchScript would compile the original, by its name
    return copy
