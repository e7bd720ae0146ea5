"""`python -m lmpipe.chat.serve MODEL_DIR [options]`: the same as `lmpipe serve MODEL_DIR`."""

import sys

from lmpipe.chat.serve.cli import main

if __name__ == "__main__":
    sys.exit(main())
