"""`mobilebuild tune RECIPE --target ID`: the fewest layers kept float (and the observer) that make an int8 target
meet its thresholds, each candidate an ordinary, cached node of the build (command.py), found by a bounded search
over the per-layer error ranking (search.py), shown as a patch of the recipe (patch.py). No torch here."""
