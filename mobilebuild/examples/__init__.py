"""Models and data behind the bundled example recipes (recipes/)."""
