"""Training: one loop for pre-training and fine-tuning, its optimizer, schedule and checkpoints."""
from .trainer import Interrupted, RunSettings, TrainConfig, Trainer, mean_loss

__all__ = ["Interrupted", "RunSettings", "TrainConfig", "Trainer", "mean_loss"]
