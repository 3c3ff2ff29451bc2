"""Framework adapters mapping one framework's hooks onto :class:`~te_gemm_callback.schedule.GemmSchedule`:
:mod:`~te_gemm_callback.adapters.lightning` (``pytorch_lightning``) and :mod:`~te_gemm_callback.adapters.hf`
(``transformers.Trainer``), each imported on its own so a job pays only for the framework it uses."""
