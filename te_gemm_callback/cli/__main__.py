"""``python -m te_gemm_callback.cli``: the ``te-gemm`` command."""

import sys

from te_gemm_callback.cli import main

sys.exit(main())
