"""Code that runs inside an emulated aarch64 Python (`mobilebuild arm64 setup` makes it): the request loop
(serve.py) and one runner per runtime, each importing only the standard library, numpy and its runtime's aarch64
wheel. Nothing here imports the rest of mobilebuild: the emulated Python has none of its dependencies."""
