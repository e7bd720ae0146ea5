"""`python -m lmpipe.models --checkpoint ... --hf-out ... --llmc-out ...` (the convert rule)."""

from lmpipe.models.convert import main

if __name__ == "__main__":
    main()
