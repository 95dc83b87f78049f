"""``python -m triton_workshop.bench.models``: the same as ``workshop bench models``."""

import sys

from triton_workshop.bench.models import main

sys.exit(main())
