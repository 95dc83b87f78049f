"""``python -m triton_workshop.bench [NAME ...] [--quick] [--out DIR]``."""

import sys

from . import main

sys.exit(main())
