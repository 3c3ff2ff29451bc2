"""The bundled default job behind ``te-gemm run``: a Llama-style model (on a GPU with TE, the
CodonFM-5B layer stack) trained for a few steps with the callback, then benchmarked and reported
(:func:`~te_gemm_callback.demo.job.run_demo`); :mod:`~te_gemm_callback.demo.models` builds its layers."""
