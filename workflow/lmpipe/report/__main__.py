"""`python -m lmpipe.report ...` (the report rule, or a progress report by hand)."""

from lmpipe.report.page import main

if __name__ == "__main__":
    main()
