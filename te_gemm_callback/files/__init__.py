"""The one place files are read and written: JSON (:mod:`~te_gemm_callback.files.jsonio`, field specs
in :mod:`~te_gemm_callback.files.specs`) and PNG figures (:mod:`~te_gemm_callback.files.png`)."""
