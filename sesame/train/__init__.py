"""Training: one loop for pre-training and fine-tuning, its optimizer, schedule and checkpoints."""
from .trainer import Interrupted, TrainConfig, Trainer, mean_loss

__all__ = ["Interrupted", "TrainConfig", "Trainer", "mean_loss"]
