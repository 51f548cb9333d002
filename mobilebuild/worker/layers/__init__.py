"""The per-layer comparison's methods (the layers stage, mobilebuild.worker.stages.layers, documents the hook each
implements): one module per route, named by its dotted path in LayersConfig.method."""
