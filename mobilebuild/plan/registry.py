"""An ordered registry: entries by key, in the order they were added (the built-in ones first, then a project's)."""


class Registry:
    def __init__(self, kind):
        self.kind = kind
        self._entries = {}

    def add(self, key, entry):
        """Add `entry` under `key`; a key added twice is a mistake, never a silent replacement."""
        if key in self._entries:
            raise ValueError(f"{self.kind} {key} is registered twice")
        self._entries[key] = entry
        return entry

    def get(self, key):
        return self._entries.get(key)

    def all(self):
        return tuple(self._entries.values())
