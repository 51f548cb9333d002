"""The emulated aarch64 environment's set-up (`mobilebuild arm64 setup`): torch-free and doit-free."""
