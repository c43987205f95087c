"""``python -m clip_dcl.train ARGS`` and ``torchrun ... -m clip_dcl.train -- ARGS``."""

import sys

from clip_dcl.train import main

sys.exit(main(sys.argv[1:], exiting=True))
