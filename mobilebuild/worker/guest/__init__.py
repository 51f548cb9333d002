"""Code that runs inside an emulated aarch64 Python (`mobilebuild arm64 setup` makes it): the request loop
(serve.py), which loads each route family's runner (its worker/guest.py) from its file. The loop and the runners
import only the standard library, numpy and a runtime's aarch64 wheel: the emulated Python has none of mobilebuild's
dependencies."""
