"""Framework adapters: each maps one training framework's hooks onto
:class:`~te_gemm_callback.schedule.GemmSchedule` and does nothing else.

- :mod:`~te_gemm_callback.adapters.lightning`: :class:`GemmProfilerCallback` (``pytorch_lightning``);
- :mod:`~te_gemm_callback.adapters.hf`: :class:`GemmProfilerTrainerCallback` (``transformers.Trainer``).

Each is imported on its own, so a job pays only for the framework it uses.
"""
