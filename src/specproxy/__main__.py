"""`python -m specproxy` is the same as the `specproxy` console script."""

from specproxy.cli import main

raise SystemExit(main())
