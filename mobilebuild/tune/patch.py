"""The winning settings as an edit of the user's recipe: one target's `quantize:` in flow style, the rest of the file
byte for byte (PyYAML would drop its comments and reformat it). Found through the YAML nodes' marks; the edit is
checked by parsing both texts: everything but that target's quantize must read the same."""

import difflib
import json
import math

import yaml

from mobilebuild.plan import recipe


def flow(value):
    """A value as one line of YAML flow style: {exclude: [broken.0, broken.1], observer: minmax}."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=math.inf).strip()


def _line_end(text, index):
    end = text.find("\n", index)
    return len(text) if end < 0 else end


def _content_end(node):
    """Where a node's own text ends: a block collection's end mark lies after the blank lines and comments that
    follow it, so its last scalar's end is taken instead."""
    if isinstance(node, yaml.ScalarNode) or node.flow_style or not node.value:
        return node.end_mark.index
    last = node.value[-1]
    return _content_end(last[1] if isinstance(node, yaml.MappingNode) else last)


def edit(text, index, quantize):
    """`text` with targets[index].quantize replaced by `quantize` (a dict), or None where the file's layout is one this
    edit does not handle (anchors, merges): then the fragment and its path are all there is."""
    try:
        root = yaml.compose(text, Loader=recipe._Loader)
        before = yaml.load(text, Loader=recipe._Loader)
    except yaml.YAMLError:
        return None
    targets = next((value for key, value in root.value if key.value == "targets"), None)
    if not isinstance(targets, yaml.SequenceNode) or index >= len(targets.value):
        return None
    entry = targets.value[index]
    if not isinstance(entry, yaml.MappingNode):  # an alias shares its node: the check below refuses its edit
        return None
    pairs = {key.value: (key, value) for key, value in entry.value}
    if "<<" in pairs:
        return None
    if "quantize" not in pairs and not quantize:
        return text  # the recipe's own settings won: an empty section would change nothing
    line = f"quantize: {flow(quantize)}"
    if "quantize" in pairs:
        key, value = pairs["quantize"]
        start, end = key.start_mark.index, _content_end(value)
        if not value.flow_style and not isinstance(value, yaml.ScalarNode):
            end = _line_end(text, end)  # a block's last line, with its comment
        edited = text[:start] + line + text[end:]
    elif entry.flow_style:
        close = entry.end_mark.index - 1  # its closing brace
        edited = text[:close].rstrip() + f", {line}" + text[close:]
    else:
        indent = entry.value[0][0].start_mark.column
        end = _line_end(text, _content_end(entry))
        edited = text[:end] + "\n" + " " * indent + line + text[end:]
    try:
        after = yaml.load(edited, Loader=recipe._Loader)
    except yaml.YAMLError:
        return None
    expected = json.loads(json.dumps(before))  # unshared: an alias's edit shows in every place it is used
    expected["targets"][index]["quantize"] = quantize
    if after != expected:
        return None
    return edited


def unified(before, after, path):
    """A patch `git apply` and `patch -p1` take."""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}",
                                 f"b/{path}")
    return "".join(line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n" for line in lines)
