"""The model config lives in runtime/core/model_config.py (torch-free, shared with the simulator);
the model code imports it from here."""
from runtime.core.model_config import FAMILIES, ModelConfig, RopeConfig

__all__ = ["FAMILIES", "ModelConfig", "RopeConfig"]
