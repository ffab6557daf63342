"""Downstream tasks: a reader, a head, a loss, metrics and decoded predictions each."""
