"""`python -m lmpipe.train ...`: the train rule's command (lmpipe.train.launch starts torchrun)."""

import sys

from lmpipe.train.launch import main

if __name__ == "__main__":
    sys.exit(main())
