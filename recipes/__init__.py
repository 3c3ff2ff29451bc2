"""Runnable training recipes: training jobs with the callback attached (not TE's precision recipes).

In a checkout they sit at the top level (``python recipes/dense.py --tiny``); installed, they are
``te_gemm_callback.recipes`` (pyproject.toml's package-dir), so ``te-gemm run`` finds its bundled
job (:func:`~te_gemm_callback.recipes.demo.run_demo`) anywhere. :mod:`~te_gemm_callback.recipes.models`
builds the layers the recipes, the validation scripts and the GPU tests share.
"""
