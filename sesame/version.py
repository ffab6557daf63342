"""The version of sesame (the distribution sesame-nlp), which runs, exports and folders record."""
__version__ = "0.1.0"
