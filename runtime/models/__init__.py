"""PyTorch models served through the paged KV pool. Entry point: runtime.models.loader.build_model.

Imports nothing here: runtime.engine.kv_pool reads runtime.models.config, and the models read the engine.
"""
