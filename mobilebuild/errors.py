"""The one exception type for user mistakes, rendered as a single line at the edge (CLI or doit reporter)."""


def few(items, limit=3):
    """Up to `limit` items for a one-line message, then how many more: "a, b, c and 4 more"."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


class MobileBuildError(Exception):
    """A problem the user can fix: which file, which field, what was expected."""

    def __init__(self, message, *, file=None, field=None):
        super().__init__(message)
        self.message = message
        self.file = file
        self.field = field

    def located(self, file):
        """Return this error attributed to `file` unless it already names one."""
        if self.file is None:
            self.file = str(file)
        return self

    def __str__(self):
        where = ": ".join(str(part) for part in (self.file, self.field) if part)
        return f"{where}: {self.message}" if where else self.message


class RecipeErrors(MobileBuildError):
    """Several problems found at once (validation reports them all, one line each)."""

    def __init__(self, errors):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))

    def __str__(self):
        return "\n".join(str(e) for e in self.errors)
