"""The one place files are read and written: JSON of our schemas, bounded and checked on read,
written atomically and only over our own (:mod:`~te_gemm_callback.files.jsonio`, field specs in
:mod:`~te_gemm_callback.files.specs`); PNG figures (:mod:`~te_gemm_callback.files.png`); what a
training job writes into its run folder (:mod:`~te_gemm_callback.schedule.run_folder`)."""
