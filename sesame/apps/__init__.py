"""Applications built on the library; none imports another's internals."""
