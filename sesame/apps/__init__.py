"""Applications built on the library: compare, ulmfit, decontaminate, neighbors, vectors, demo, generate,
prompting, cove.

Each uses the library (``sesame.pipelines``, ``sesame.data``, ...) and never another application's
internals; what two of them share lives in the library (``sesame.pipelines.stages``).
"""
