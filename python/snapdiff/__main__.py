"""`python -m snapdiff ARGS`: the same as the `snapdiff` command."""

from snapdiff._cli import main

main()
